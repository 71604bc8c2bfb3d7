//! Pure conversions from Vulkan values to the names and strings Helios reports.
//!
//! Nothing here touches a Vulkan object, so all of it is unit-tested without a device. Names
//! are short lower-case words (`device_local`, `shuffle_relative`, `f16`) because they end up
//! in `helios info`, in JSON and in autotuner cache keys.

use ash::vk;
use std::ffi::c_char;

use crate::caps::DeviceType;

/// `VK_COMPONENT_TYPE_BFLOAT16_KHR` (VK_KHR_shader_bfloat16); ash 0.38 predates it.
pub const COMPONENT_TYPE_BFLOAT16_KHR: i32 = 1_000_141_000;

/// PCI vendor id (or Khronos vendor id) to a vendor name; unknown ids as hex.
pub fn vendor_name(vendor_id: u32) -> String {
    match vendor_id {
        0x10DE => "NVIDIA".into(),
        0x1002 => "AMD".into(),
        0x8086 => "Intel".into(),
        0x13B5 => "ARM".into(),
        0x5143 => "Qualcomm".into(),
        0x10005 => "Mesa".into(),
        other => format!("{other:#x}"),
    }
}

/// A Vulkan version number as "major.minor.patch" (the variant bits are dropped).
pub fn api_version(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

/// `driverVersion` decoded the way the vendor encodes it: NVIDIA packs 10.8.8.6 bits,
/// everyone else (Mesa, AMD, ...) uses the Vulkan version layout.
pub fn driver_version(vendor_id: u32, v: u32) -> String {
    if vendor_id == 0x10DE {
        format!(
            "{}.{}.{}.{}",
            v >> 22,
            (v >> 14) & 0xff,
            (v >> 6) & 0xff,
            v & 0x3f
        )
    } else {
        api_version(v)
    }
}

pub fn device_type(t: vk::PhysicalDeviceType) -> DeviceType {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::DiscreteGpu,
        vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::IntegratedGpu,
        vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::VirtualGpu,
        vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
        _ => DeviceType::Other,
    }
}

/// Collects the names of the set bits of `flags` from a (bit, name) table; bits the table
/// does not know are reported as hex so nothing is silently dropped.
fn flag_names(flags: u32, table: &[(u32, &str)]) -> Vec<String> {
    let mut names = Vec::new();
    let mut known = 0u32;
    for &(bit, name) in table {
        known |= bit;
        if flags & bit != 0 {
            names.push(name.to_owned());
        }
    }
    let unknown = flags & !known;
    if unknown != 0 {
        names.push(format!("{unknown:#x}"));
    }
    names
}

pub fn memory_property_names(flags: vk::MemoryPropertyFlags) -> Vec<String> {
    use vk::MemoryPropertyFlags as F;
    flag_names(
        flags.as_raw(),
        &[
            (F::DEVICE_LOCAL.as_raw(), "device_local"),
            (F::HOST_VISIBLE.as_raw(), "host_visible"),
            (F::HOST_COHERENT.as_raw(), "host_coherent"),
            (F::HOST_CACHED.as_raw(), "host_cached"),
            (F::LAZILY_ALLOCATED.as_raw(), "lazily_allocated"),
            (F::PROTECTED.as_raw(), "protected"),
            (F::DEVICE_COHERENT_AMD.as_raw(), "device_coherent_amd"),
            (F::DEVICE_UNCACHED_AMD.as_raw(), "device_uncached_amd"),
            (F::RDMA_CAPABLE_NV.as_raw(), "rdma_capable_nv"),
        ],
    )
}

pub fn queue_flag_names(flags: vk::QueueFlags) -> Vec<String> {
    use vk::QueueFlags as F;
    flag_names(
        flags.as_raw(),
        &[
            (F::GRAPHICS.as_raw(), "graphics"),
            (F::COMPUTE.as_raw(), "compute"),
            (F::TRANSFER.as_raw(), "transfer"),
            (F::SPARSE_BINDING.as_raw(), "sparse_binding"),
            (F::PROTECTED.as_raw(), "protected"),
            (F::VIDEO_DECODE_KHR.as_raw(), "video_decode"),
            (F::VIDEO_ENCODE_KHR.as_raw(), "video_encode"),
            (F::OPTICAL_FLOW_NV.as_raw(), "optical_flow"),
        ],
    )
}

pub fn subgroup_op_names(flags: vk::SubgroupFeatureFlags) -> Vec<String> {
    use vk::SubgroupFeatureFlags as F;
    flag_names(
        flags.as_raw(),
        &[
            (F::BASIC.as_raw(), "basic"),
            (F::VOTE.as_raw(), "vote"),
            (F::ARITHMETIC.as_raw(), "arithmetic"),
            (F::BALLOT.as_raw(), "ballot"),
            (F::SHUFFLE.as_raw(), "shuffle"),
            (F::SHUFFLE_RELATIVE.as_raw(), "shuffle_relative"),
            (F::CLUSTERED.as_raw(), "clustered"),
            (F::QUAD.as_raw(), "quad"),
            (F::PARTITIONED_NV.as_raw(), "partitioned_nv"),
            (F::ROTATE_KHR.as_raw(), "rotate"),
            (F::ROTATE_CLUSTERED_KHR.as_raw(), "rotate_clustered"),
        ],
    )
}

/// Cooperative-matrix component type names as kernels spell dtypes.
pub fn component_type_name(t: vk::ComponentTypeKHR) -> String {
    use vk::ComponentTypeKHR as C;
    match t {
        C::FLOAT16 => "f16".into(),
        C::FLOAT32 => "f32".into(),
        C::FLOAT64 => "f64".into(),
        C::SINT8 => "s8".into(),
        C::SINT16 => "s16".into(),
        C::SINT32 => "s32".into(),
        C::SINT64 => "s64".into(),
        C::UINT8 => "u8".into(),
        C::UINT16 => "u16".into(),
        C::UINT32 => "u32".into(),
        C::UINT64 => "u64".into(),
        other if other.as_raw() == COMPONENT_TYPE_BFLOAT16_KHR => "bf16".into(),
        other => format!("type_{}", other.as_raw()),
    }
}

pub fn scope_name(s: vk::ScopeKHR) -> String {
    match s {
        vk::ScopeKHR::DEVICE => "device".into(),
        vk::ScopeKHR::WORKGROUP => "workgroup".into(),
        vk::ScopeKHR::SUBGROUP => "subgroup".into(),
        vk::ScopeKHR::QUEUE_FAMILY => "queue_family".into(),
        other => format!("scope_{}", other.as_raw()),
    }
}

/// Bytes as lower-case hex without separators (UUIDs, cache keys).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fixed-size, NUL-terminated C string field (device name, driver name) to a `String`.
/// A field without a NUL (a broken driver) is read to its end instead of past it.
pub fn c_chars(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(api_version(vk::make_api_version(0, 1, 3, 239)), "1.3.239");
        // NVIDIA 580.159.4 as its driver reports it.
        let nv = (580 << 22) | (159 << 14) | (4 << 6);
        assert_eq!(driver_version(0x10DE, nv), "580.159.4.0");
        assert_eq!(
            driver_version(0x10005, vk::make_api_version(0, 0, 0, 1)),
            "0.0.1"
        );
    }

    #[test]
    fn vendors() {
        assert_eq!(vendor_name(0x10DE), "NVIDIA");
        assert_eq!(vendor_name(0x10005), "Mesa");
        assert_eq!(vendor_name(0x1234), "0x1234");
    }

    #[test]
    fn flags() {
        let f = vk::MemoryPropertyFlags::DEVICE_LOCAL | vk::MemoryPropertyFlags::HOST_VISIBLE;
        assert_eq!(memory_property_names(f), ["device_local", "host_visible"]);
        let q = vk::QueueFlags::COMPUTE | vk::QueueFlags::from_raw(1 << 30);
        assert_eq!(queue_flag_names(q), ["compute", "0x40000000"]);
        let s = vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE;
        assert_eq!(subgroup_op_names(s), ["basic", "shuffle_relative"]);
    }

    #[test]
    fn component_types() {
        assert_eq!(component_type_name(vk::ComponentTypeKHR::FLOAT16), "f16");
        assert_eq!(
            component_type_name(vk::ComponentTypeKHR::from_raw(COMPONENT_TYPE_BFLOAT16_KHR)),
            "bf16"
        );
        assert_eq!(scope_name(vk::ScopeKHR::SUBGROUP), "subgroup");
    }

    #[test]
    fn strings() {
        assert_eq!(hex(&[0x00, 0xab, 0x10]), "00ab10");
        let name: Vec<c_char> = b"llvmpipe\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_chars(&name), "llvmpipe");
        let unterminated: Vec<c_char> = b"abc".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_chars(&unterminated), "abc");
    }
}
