//! Every `HELIOS_*` environment switch, in one place.
//!
//! | variable | effect |
//! |---|---|
//! | `HELIOS_VALIDATION=1` | Khronos validation layer with synchronization validation; messages are collected (tests fail on any) |
//! | `HELIOS_DEVICE=<index or name>` | pick a device other than the best one (`helios info` lists them) |
//! | `HELIOS_BINDING=address\|descriptor` | how kernels receive buffers: device addresses in push constants (default) or push descriptors |
//! | `HELIOS_BATCH=<n>` | dispatches per submitted batch (default 256; 1 submits every op alone) |
//! | `HELIOS_SPIN_US=<µs>` | how long a host wait polls the GPU before sleeping (default 1000) |
//! | `HELIOS_PROFILE=1` | GPU timestamps around every dispatch; `Device::profile_report()` gives the per-kernel table |
//! | `HELIOS_TRANSFER_QUEUE=0` | staged copies stay on the compute queue |
//! | `HELIOS_BAR=0` | device-local buffers never use the host-visible (BAR) memory type |
//! | `HELIOS_PIPELINE_CACHE=0` | do not persist the Vulkan pipeline cache |
//! | `HELIOS_CACHE_DIR=<dir>` | root of the on-disk caches (default `$XDG_CACHE_HOME/helios` or `~/.cache/helios`) |
//! | `HELIOS_VERBOSE=1` | notes about ignored cache files and failed saves |
//! | `HELIOS_EW_VECS=1\|2\|4` | vec4s per invocation in element-wise kernels (tuning experiments) |
//! | `HELIOS_EW_EXACT=0` | element-wise kernels keep their bounds checks even when the size is a whole number of tiles |
//! | `HELIOS_READBACK=kernel\|copy` | read tensors back through a copy kernel into host memory, or the copy engine (default: kernel for ≤ 1 MiB on discrete GPUs) |
//! | `HELIOS_WG=<n>` | workgroup size (along x) for every kernel, overriding the default (tuning experiments) |
//! | `HELIOS_DUMP_KERNELS=<dir>` | write the SPIR-V assembly of every kernel compiled to `<dir>/<name>.spvasm` |
//! | `HELIOS_SPIRV_VAL=<path>` | the `spirv-val` binary tests use (default: `spirv-val` on PATH) |
//! | `HELIOS_MATMUL_VARIANT=<name>` | force a matmul variant (`simt128x128`, `coop128x128w2x2`, ...: `helios_kernels::matmul::VARIANTS`) |
//! | `HELIOS_MATMUL_TUNE=0\|1` | matmul autotuning off (documented default variant) or on also for CPU devices (default: on for GPUs; winners cached per device UUID + driver under the cache root) |
//! | `HELIOS_NO_SUBGROUP=1` | reductions, softmax and norms combine through shared-memory trees instead of subgroup operations |
//! | `HELIOS_ROWS=cached\|streaming` | force the softmax/norm variant: row kept in registers, or streamed once per pass (default: by row length) |
//! | `HELIOS_ROW_UNROLL=<n>` | 16-byte loads per invocation per loop step in reduce/softmax/norm kernels (1..=8, default 4) |
//! | `HELIOS_ROW_SLOTS=<n>` | most 16-byte slots per invocation a cached softmax/norm row keeps in registers (1..=16; default per family) |
//! | `HELIOS_SPLIT_GROUPS=<n>` | workgroups a split (two-phase) reduction aims for (default 2048) |
//! | `HELIOS_NORM_ROWS=<n>` | rows each invocation group of the cached layernorm/rmsnorm backward walks, summing dgamma/dbeta (default 4) |

use helios_spirv::{Binding, KernelModule};

/// `HELIOS_BINDING`: `descriptor` selects push descriptors; anything else (or unset) device
/// addresses, which measured faster where both exist (see bench/results).
pub(crate) fn binding() -> Binding {
    match std::env::var("HELIOS_BINDING").as_deref() {
        Ok("descriptor") => Binding::Descriptor,
        _ => Binding::DeviceAddress,
    }
}

/// `HELIOS_EW_VECS`: vec4s per invocation for element-wise kernels (1, 2 or 4).
pub(crate) fn elementwise_vecs() -> Option<u8> {
    let v = std::env::var("HELIOS_EW_VECS").ok()?;
    match v.trim() {
        "1" => Some(1),
        "2" => Some(2),
        "4" => Some(4),
        _ => {
            eprintln!("helios: HELIOS_EW_VECS={v:?} ignored: use 1, 2 or 4");
            None
        }
    }
}

/// `HELIOS_EW_EXACT=0`: no exact (unchecked) element-wise variant.
pub(crate) fn elementwise_exact() -> bool {
    !matches!(
        std::env::var("HELIOS_EW_EXACT").as_deref(),
        Ok("0" | "false")
    )
}

/// `HELIOS_READBACK=kernel|copy`: forces copy-kernel or copy-engine read-backs.
pub(crate) fn readback() -> Option<crate::Readback> {
    match std::env::var("HELIOS_READBACK").as_deref() {
        Ok("kernel") => Some(crate::Readback::Kernel),
        Ok("copy") => Some(crate::Readback::CopyEngine),
        _ => None,
    }
}

/// `HELIOS_WG=<n>`: a workgroup size for every kernel; ignored unless a power of two in
/// 32..=1024 (a note says so).
pub(crate) fn workgroup_override() -> Option<u32> {
    let v = std::env::var("HELIOS_WG").ok()?;
    match v.trim().parse::<u32>() {
        Ok(n) if n.is_power_of_two() && (32..=1024).contains(&n) => Some(n),
        _ => {
            eprintln!("helios: HELIOS_WG={v:?} ignored: use a power of two from 32 to 1024");
            None
        }
    }
}

/// Writes `module`'s disassembly under `HELIOS_DUMP_KERNELS`, if set. Failures to write are
/// reported on stderr, never fatal: dumping is a debugging aid.
pub(crate) fn dump_kernel(module: &KernelModule) {
    let Some(dir) = std::env::var_os("HELIOS_DUMP_KERNELS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let path = dir.join(format!("{}.spvasm", module.name));
    let result =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, module.disassemble()));
    if let Err(e) = result {
        eprintln!("helios: cannot dump kernel to {}: {e}", path.display());
    }
}

/// `HELIOS_NO_SUBGROUP=1`: shared-memory trees instead of subgroup operations.
pub(crate) fn no_subgroup() -> bool {
    matches!(
        std::env::var("HELIOS_NO_SUBGROUP").as_deref(),
        Ok("1" | "true")
    )
}

/// A number from `var` inside `range`, or `None` with a note when it is set but invalid.
fn number_in(var: &str, range: std::ops::RangeInclusive<u32>) -> Option<u32> {
    let v = std::env::var(var).ok()?;
    match v.trim().parse::<u32>() {
        Ok(n) if range.contains(&n) => Some(n),
        _ => {
            eprintln!(
                "helios: {var}={v:?} ignored: use a number from {} to {}",
                range.start(),
                range.end()
            );
            None
        }
    }
}

/// The row kernels' switches: `HELIOS_ROWS`, `HELIOS_ROW_UNROLL`, `HELIOS_ROW_SLOTS`,
/// `HELIOS_SPLIT_GROUPS`, `HELIOS_NORM_ROWS` and `HELIOS_WG`.
pub(crate) fn row_config() -> helios_kernels::rows::RowConfig {
    use helios_kernels::rows::{RowConfig, RowVariant};
    let d = RowConfig::default();
    let variant = match std::env::var("HELIOS_ROWS").as_deref() {
        Ok("cached") => RowVariant::Cached,
        Ok("streaming") => RowVariant::Streaming,
        Ok(v) => {
            eprintln!("helios: HELIOS_ROWS={v:?} ignored: use cached or streaming");
            RowVariant::Auto
        }
        Err(_) => RowVariant::Auto,
    };
    RowConfig {
        variant,
        unroll: number_in("HELIOS_ROW_UNROLL", 1..=8).map_or(d.unroll, |n| n as u8),
        cached_slots: number_in("HELIOS_ROW_SLOTS", 1..=16),
        target_groups: number_in("HELIOS_SPLIT_GROUPS", 1..=1 << 20).unwrap_or(d.target_groups),
        workgroup: workgroup_override(),
        norm_rows: number_in("HELIOS_NORM_ROWS", 1..=1 << 16),
    }
}
