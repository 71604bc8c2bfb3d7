//! Every `HELIOS_*` environment switch, in one place.
//!
//! | variable | effect |
//! |---|---|
//! | `HELIOS_VALIDATION=1` | Khronos validation layer with synchronization validation; messages are collected (tests fail on any) |
//! | `HELIOS_DEVICE=<index or name>` | pick a device other than the best one (`helios info` lists them) |
//! | `HELIOS_BINDING=address\|descriptor` | how kernels receive buffers: device addresses in push constants (default) or push descriptors |
//! | `HELIOS_BATCH=<n>` | dispatches per submitted batch (default 256; 1 submits every op alone) |
//! | `HELIOS_SPIN_US=<µs>` | how long a host wait polls the GPU before sleeping (default 100000 on GPUs, 1000 on CPU devices) |
//! | `HELIOS_PROFILE=1` | GPU timestamps around every dispatch; `Device::profile_report()` gives the per-kernel table |
//! | `HELIOS_TRANSFER_QUEUE=0` | staged copies stay on the compute queue |
//! | `HELIOS_BAR=0` | device-local buffers never use the host-visible (BAR) memory type |
//! | `HELIOS_MEMORY_LIMIT=<bytes>` | the most device-local memory the pool may hold (`512M`, `2G`): past it an allocation fails as out of device memory; for testing out-of-memory handling, or sharing a GPU |
//! | `HELIOS_PIPELINE_CACHE=0` | do not persist the Vulkan pipeline cache |
//! | `HELIOS_CACHE_DIR=<dir>` | root of the on-disk caches (default `$XDG_CACHE_HOME/helios` or `~/.cache/helios`) |
//! | `HELIOS_VERBOSE=1` | notes about ignored cache files and failed saves |
//! | `HELIOS_EW_VECS=1\|2\|4` | vec4s per invocation in element-wise kernels (tuning experiments) |
//! | `HELIOS_EW_EXACT=0` | element-wise kernels keep their bounds checks even when the size is a whole number of tiles |
//! | `HELIOS_READBACK=kernel\|copy` | read tensors back through a copy kernel into host memory, or the copy engine (default: kernel for ≤ 1 MiB on discrete GPUs) |
//! | `HELIOS_WG=<n>` | workgroup size (along x) for every kernel, overriding the default (tuning experiments) |
//! | `HELIOS_DUMP_KERNELS=<dir>` | write the SPIR-V assembly of every kernel compiled to `<dir>/<name>.spvasm` (and, with `HELIOS_PIPELINE_STATS=2`, the driver's text representations to `<dir>/<name>.<executable>.<representation>.txt`) |
//! | `HELIOS_PIPELINE_STATS=1\|2` | where the device offers VK_KHR_pipeline_executable_properties, pipelines capture the driver's compiler statistics (`1`; on NVIDIA register count, binary size, stack, local (spill) and shared memory) or statistics and the driver's internal representations, where it offers any (`2`; NVIDIA 580 offers none); each kernel compiled prints `helios: stats <kernel>: <stat>=<value>, ...` on stderr, and `Device::kernel_statistics()` returns them |
//! | `HELIOS_SPIRV_VAL=<path>` | the `spirv-val` binary tests use (default: `.tools/bin/spirv-val`, installed by `scripts/deps.sh test`; never one on PATH) |
//! | `HELIOS_MATMUL_VARIANT=<name>` | force a matmul variant (`simt128x128`, `coop128x128w2x2`, ...: `helios_kernels::matmul::VARIANTS`) |
//! | `HELIOS_COOPMAT2=0` | leave VK_NV_cooperative_matrix2 off: the workgroup-scope matmul variants (`wg...`) never run |
//! | `HELIOS_MATMUL_TUNE=0\|1` | matmul autotuning off (documented default variant) or on also for CPU devices (default: on for GPUs; winners cached per device UUID, driver and enabled kernel features under the cache root) |
//! | `HELIOS_NO_SUBGROUP=1` | reductions, softmax and norms combine through shared-memory trees instead of subgroup operations |
//! | `HELIOS_ROWS=cached\|streaming` | force the softmax/norm variant: row kept in registers, or streamed once per pass (default: by row length) |
//! | `HELIOS_ROW_UNROLL=<n>` | 16-byte loads per invocation per loop step in reduce/softmax/norm kernels (1..=8, default 4) |
//! | `HELIOS_ROW_SLOTS=<n>` | most 16-byte slots per invocation a cached softmax/norm row keeps in registers (1..=16; default per family) |
//! | `HELIOS_SPLIT_GROUPS=<n>` | workgroups a split (two-phase) reduction aims for (default 2048) |
//! | `HELIOS_ROW_WHOLE=0` | softmax and norm kernels keep their per-slot bounds checks even for rows a multiple of 4 long (for measuring what the unchecked kernels gain) |
//! | `HELIOS_NORM_ROWS=<n>` | rows each invocation group of the cached layernorm/rmsnorm backward walks, summing dgamma/dbeta (default: the power of two at or above rows × width / 786432, 2 to 32) |
//! | `HELIOS_FUSION=0` | realise every element-wise node and product as it is built (one kernel per op), to measure what fusion buys |
//! | `HELIOS_DEBUG=1` | print each realisation of the lazy graph: the fused kernel, its nodes, inputs, outputs and bytes moved, or the product and the nodes in its epilogue |
//! | `HELIOS_WARM_MS=<ms>` | how long timing code (the matmul tuner, `helios bench`) keeps the GPU busy before it measures, so the SM clock has left its idle state (default 1000 on GPUs, 0 on CPU devices) |

use helios_spirv::{Binding, KernelModule};

/// `HELIOS_BINDING`: `descriptor` selects push descriptors; anything else (or unset) device
/// addresses, which measured faster where both exist (see bench/results).
pub(crate) fn binding() -> Binding {
    match std::env::var("HELIOS_BINDING").as_deref() {
        Ok("descriptor") => Binding::Descriptor,
        _ => Binding::DeviceAddress,
    }
}

/// `HELIOS_FUSION=0`: element-wise nodes and products run one by one (read once per process).
pub(crate) fn fusion() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("HELIOS_FUSION").as_deref() != Ok("0"))
}

/// `HELIOS_DEBUG=1`: print each realisation (read once per process).
pub(crate) fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| matches!(std::env::var("HELIOS_DEBUG").as_deref(), Ok(v) if v != "0"))
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

/// With `HELIOS_DUMP_KERNELS=dir`, native kernels are written there as `<name>.ptx`.
pub(crate) fn dump_native(module: &helios_ptx::Module) {
    let Some(dir) = std::env::var_os("HELIOS_DUMP_KERNELS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let path = dir.join(format!("{}.ptx", module.name));
    let result = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, &module.text));
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
/// `HELIOS_SPLIT_GROUPS`, `HELIOS_NORM_ROWS`, `HELIOS_ROW_WHOLE` and `HELIOS_WG`.
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
        unroll: number_in("HELIOS_ROW_UNROLL", 1..=8).map(|n| n as u8),
        cached_slots: number_in("HELIOS_ROW_SLOTS", 1..=16),
        target_groups: number_in("HELIOS_SPLIT_GROUPS", 1..=1 << 20).unwrap_or(d.target_groups),
        workgroup: workgroup_override(),
        norm_rows: number_in("HELIOS_NORM_ROWS", 1..=1 << 16),
        whole_rows: std::env::var("HELIOS_ROW_WHOLE").as_deref() != Ok("0"),
    }
}

/// `HELIOS_WARM_MS`: the warm-up before timed work ([`crate::Device::warm_up`]); `None`
/// when unset (the device's default applies).
pub fn warm_ms() -> Option<u32> {
    number_in("HELIOS_WARM_MS", 0..=60_000)
}

/// `HELIOS_PIPELINE_STATS=1|2`: print the driver's statistics of every kernel compiled
/// (the Context, which reads the same variable, captures them).
pub(crate) fn pipeline_stats_report() -> bool {
    matches!(
        std::env::var("HELIOS_PIPELINE_STATS")
            .as_deref()
            .map(str::trim),
        Ok("1" | "2")
    )
}

/// Writes the text representations of `kernel`'s executables (captured with
/// `HELIOS_PIPELINE_STATS=2`) to `<HELIOS_DUMP_KERNELS>/<kernel>.<executable>.<name>.txt`,
/// if that is set; failures are reported on stderr, never fatal.
pub(crate) fn dump_representations(kernel: &str, executables: &[helios_vk::ExecutableStats]) {
    let Some(dir) = std::env::var_os("HELIOS_DUMP_KERNELS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    for (i, exec) in executables.iter().enumerate() {
        for (name, text) in &exec.representations {
            let path = dir.join(format!("{kernel}.{i}.{}.txt", sanitize(name)));
            let result = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text));
            if let Err(e) = result {
                eprintln!(
                    "helios: cannot dump {name} of {kernel} to {}: {e}",
                    path.display()
                );
            }
        }
    }
}

/// `name` with everything but ASCII letters, digits, `-` and `_` replaced by `_`, so a driver's
/// representation name ("NVIDIA SASS", "SPIR-V / NIR") makes a safe file-name part.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            _ => '_',
        })
        .collect();
    if s.is_empty() {
        "representation".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn representation_names_make_file_names() {
        assert_eq!(super::sanitize("NVIDIA SASS"), "NVIDIA_SASS");
        assert_eq!(super::sanitize("a/b.c"), "a_b_c");
        assert_eq!(super::sanitize(""), "representation");
    }
}
