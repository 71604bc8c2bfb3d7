//! Every `HELIOS_*` switch the helios crate reads, read here and nowhere else. What each
//! does is documented in one place, `docs/ENVIRONMENT.md` (the user-facing ones also in the
//! README).

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
        unroll: number_in("HELIOS_ROW_UNROLL", 1..=8).map(|n| n as u8),
        cached_slots: number_in("HELIOS_ROW_SLOTS", 1..=16),
        target_groups: number_in("HELIOS_SPLIT_GROUPS", 1..=1 << 20).unwrap_or(d.target_groups),
        workgroup: workgroup_override(),
        norm_rows: number_in("HELIOS_NORM_ROWS", 1..=1 << 16),
        ..d
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

/// `HELIOS_VERBOSE=1`: notes about ignored cache files and failed saves, and what the tuners
/// did.
pub(crate) fn verbose() -> bool {
    std::env::var("HELIOS_VERBOSE").as_deref() == Ok("1")
}

/// `HELIOS_TUNE_TRACE`: print each step of a matmul class's tuning as it starts.
pub(crate) fn tune_trace() -> bool {
    std::env::var_os("HELIOS_TUNE_TRACE").is_some()
}

/// `HELIOS_MATMUL_VARIANT`, trimmed; `None` when unset or empty (read once per process:
/// every matmul asks).
pub(crate) fn matmul_variant() -> Option<&'static str> {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::env::var("HELIOS_MATMUL_VARIANT")
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    })
    .as_deref()
}

/// A tuner's switch (`HELIOS_MATMUL_TUNE`, `HELIOS_ATTN_TUNE`): `Some(false)` for `0`,
/// `Some(true)` for `1`, `None` (the device's default) otherwise.
fn tune_switch(name: &str) -> Option<bool> {
    match std::env::var(name).as_deref().map(str::trim) {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// `HELIOS_MATMUL_TUNE=0|1|full`: off, online (also on CPU devices), exhaustive.
pub(crate) fn matmul_tune() -> Option<crate::ops::Tuning> {
    use crate::ops::Tuning;
    match std::env::var("HELIOS_MATMUL_TUNE")
        .as_deref()
        .map(str::trim)
    {
        Ok("full") => Some(Tuning::Exhaustive),
        _ => tune_switch("HELIOS_MATMUL_TUNE").map(|on| match on {
            true => Tuning::Online,
            false => Tuning::Off,
        }),
    }
}

/// `HELIOS_ATTN_TUNE=0|1` (read once per process: every attention call asks).
pub(crate) fn attention_tune() -> Option<bool> {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| tune_switch("HELIOS_ATTN_TUNE"))
}

/// `HELIOS_ATTN_VARIANT`, trimmed; `None` when unset or empty.
pub(crate) fn attention_variant() -> Option<String> {
    std::env::var("HELIOS_ATTN_VARIANT")
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
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
