//! The device properties matmul selection needs.

use helios_kernels::{MatmulCaps, Storage, WgSupport};
use helios_vk::DeviceType;

use crate::Device;

/// The device properties matmul selection needs (found once per device).
pub fn matmul_caps(device: &Device) -> MatmulCaps {
    device.matmul_caps_once(|| find(device)).clone()
}

fn find(device: &Device) -> MatmulCaps {
    let ctx = device.context();
    let caps = ctx.caps();
    let en = ctx.enabled();
    let fixed_subgroup = match (caps.subgroup.min_size, caps.subgroup.max_size) {
        (Some(lo), Some(hi)) => lo == hi,
        _ => true,
    };
    let coop_ok = en.cooperative_matrix && en.vulkan_memory_model && fixed_subgroup;
    let has = |t: &str| {
        caps.cooperative_matrix.iter().any(|s| {
            (s.m, s.n, s.k) == (16, 16, 16)
                && s.a == t
                && s.b == t
                && s.c == "f32"
                && s.result == "f32"
                && s.scope == "subgroup"
        })
    };
    let coop_f16 = coop_ok && en.shader_float16 && has("f16");
    let coop_bf16 = coop_ok && en.bfloat16_cooperative_matrix && has("bf16");
    let coop_wg = match &caps.cooperative_matrix2 {
        Some(c2) if en.cooperative_matrix_workgroup_scope => c2
            .flexible
            .iter()
            .filter(|s| s.scope == "workgroup" && s.a == s.b && s.c == "f32" && s.result == "f32")
            .filter_map(|s| {
                let input = match s.a.as_str() {
                    "f16" if coop_f16 => Storage::F16,
                    "bf16" if coop_bf16 => Storage::BF16,
                    _ => return None,
                };
                Some(WgSupport {
                    input,
                    invocations: s.workgroup_invocations,
                    granularity: [s.m_granularity, s.n_granularity, s.k_granularity],
                    max_dimension: c2.max_dimension,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    MatmulCaps {
        max_shared_bytes: caps.limits.max_compute_shared_memory,
        max_invocations: caps.limits.max_workgroup_invocations,
        subgroup: caps.subgroup.size,
        coop_f16,
        coop_bf16,
        coop_wg,
        coop_wg_tensor: en.cooperative_matrix_tensor_addressing,
        cpu_threads: (caps.device_type == DeviceType::Cpu).then(host_threads),
        native: device.native_target(),
        subgroup_add: caps.subgroup.compute_stage
            && caps.subgroup.operations.iter().any(|o| o == "arithmetic")
            && caps.subgroup.min_size.unwrap_or(caps.subgroup.size) >= 4
            && caps.subgroup.max_size.unwrap_or(caps.subgroup.size) <= 64,
    }
}

/// How many threads lavapipe runs workgroups on: one per core unless `LP_NUM_THREADS` says
/// otherwise. Read once per process: `matmul_caps` is asked per op (attention's selection),
/// and finding the core count reads cgroup files on Linux.
fn host_threads() -> u32 {
    static THREADS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("LP_NUM_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
    })
}
