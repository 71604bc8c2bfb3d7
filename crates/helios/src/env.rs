//! Every `HELIOS_*` environment switch, in one place.
//!
//! | variable | effect |
//! |---|---|
//! | `HELIOS_VALIDATION=1` | Khronos validation layer with synchronization validation; messages are collected (tests fail on any) |
//! | `HELIOS_DEVICE=<index or name>` | pick a device other than the best one (`helios info` lists them) |
//! | `HELIOS_DUMP_KERNELS=<dir>` | write the SPIR-V assembly of every kernel compiled to `<dir>/<name>.spvasm` |
//! | `HELIOS_SPIRV_VAL=<path>` | the `spirv-val` binary tests use (default: `spirv-val` on PATH) |

use helios_spirv::KernelModule;

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
