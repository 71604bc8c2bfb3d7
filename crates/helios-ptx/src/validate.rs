//! Runs NVIDIA `ptxas` on emitted PTX, the way helios-spirv runs `spirv-val` on SPIR-V. The
//! assembler is `HELIOS_PTXAS` when set, else the project's own `.tools/bin/ptxas` (CUDA 12.9,
//! installed by `scripts/deps.sh test`); never whatever `ptxas` happens to be on `PATH`, whose
//! CUDA version would decide which PTX ISA and targets are accepted. PTX that cannot be assembled
//! is an error, not a skip. A successful run also reports the resource usage `-v` prints and
//! keeps the cubin, so tests can check register counts and spills, or look at the SASS.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(
        "cannot run ptxas `{tool}`: {source}. Run `scripts/deps.sh test` (installs ptxas 12.9 into \
         .tools/bin) or point HELIOS_PTXAS at a ptxas from CUDA 12.4 or newer"
    )]
    ToolMissing {
        tool: String,
        source: std::io::Error,
    },
    #[error("ptxas ({arch}) rejected kernel `{kernel}`:\n{message}")]
    Invalid {
        kernel: String,
        arch: String,
        message: String,
    },
    #[error(
        "cannot run nvdisasm `{tool}`: {source}. Run `scripts/deps.sh test` (installs nvdisasm \
         into .tools/bin) or point HELIOS_NVDISASM at one from CUDA 12.4 or newer"
    )]
    DisassemblerMissing {
        tool: String,
        source: std::io::Error,
    },
    #[error("nvdisasm could not read the cubin of `{kernel}`:\n{message}")]
    Disassembly { kernel: String, message: String },
    /// The temporary `.ptx` could not be written or the `.cubin` read back: a problem of this
    /// machine's temp directory, not of the PTX or the tool.
    #[error("ptxas scratch file `{path}` for kernel `{kernel}`: {source}")]
    Scratch {
        kernel: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `ptxas -v` reported for a module that assembled. Each count is the largest over the
/// module's functions (a Helios module is one kernel, so in practice that kernel's numbers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    /// Static shared memory in bytes (dynamic shared memory is set at launch, not here).
    pub shared_bytes: u32,
    /// `ptxas warning : ...` lines, without that prefix (spills show up here too), and the
    /// info lines that announce a "Potential Performance Loss" (C7513: every `wgmma`
    /// serialized, which cost the native attention forward 13% in session 36).
    pub warnings: Vec<String>,
    /// The assembled ELF, for SASS inspection (`cuobjdump -sass` / `nvdisasm`).
    pub cubin: Vec<u8>,
}

/// The `ptxas` binary: `HELIOS_PTXAS`, else `<workspace>/.tools/bin/ptxas`.
pub fn assembler() -> PathBuf {
    match std::env::var_os("HELIOS_PTXAS") {
        Some(tool) if !tool.is_empty() => PathBuf::from(tool),
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.tools/bin/ptxas"
        )),
    }
}

/// The `nvdisasm` binary: `HELIOS_NVDISASM`, else `<workspace>/.tools/bin/nvdisasm`.
pub fn disassembler() -> PathBuf {
    match std::env::var_os("HELIOS_NVDISASM") {
        Some(tool) if !tool.is_empty() => PathBuf::from(tool),
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.tools/bin/nvdisasm"
        )),
    }
}

/// The SASS of `cubin` (a [`PtxasReport::cubin`] of kernel `kernel`), one instruction a
/// line, as [`disassembler`] prints it.
pub fn sass(kernel: &str, cubin: &[u8]) -> Result<String, ValidateError> {
    let scratch = ScratchFiles::new();
    std::fs::write(&scratch.cubin, cubin).map_err(|source| ValidateError::Scratch {
        kernel: kernel.to_string(),
        path: scratch.cubin.clone(),
        source,
    })?;
    let tool = disassembler();
    let out = Command::new(&tool)
        .arg("-c")
        .arg(&scratch.cubin)
        .output()
        .map_err(|source| ValidateError::DisassemblerMissing {
            tool: tool.display().to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(ValidateError::Disassembly {
            kernel: kernel.to_string(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Assembles `ptx` (named `kernel` in messages) for `arch` (e.g. `sm_90a`) with [`assembler`].
pub fn ptxas(kernel: &str, ptx: &str, arch: &str) -> Result<PtxasReport, ValidateError> {
    ptxas_with(&assembler(), kernel, ptx, arch)
}

/// Removes the scratch files on every path out of [`ptxas_with`], errors included.
struct ScratchFiles {
    ptx: PathBuf,
    cubin: PathBuf,
}

impl ScratchFiles {
    fn new() -> Self {
        // pid + counter: unique across the parallel test threads and concurrent test binaries.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let stem = std::env::temp_dir().join(format!("helios-ptx-{}-{n}", std::process::id()));
        ScratchFiles {
            ptx: stem.with_extension("ptx"),
            cubin: stem.with_extension("cubin"),
        }
    }
}

impl Drop for ScratchFiles {
    fn drop(&mut self) {
        // Best effort: the cubin does not exist when ptxas failed.
        let _ = std::fs::remove_file(&self.ptx);
        let _ = std::fs::remove_file(&self.cubin);
    }
}

/// [`ptxas`] with an explicit tool, so tests can name a missing one without touching the
/// process environment (tests run in parallel).
fn ptxas_with(
    tool: &Path,
    kernel: &str,
    ptx: &str,
    arch: &str,
) -> Result<PtxasReport, ValidateError> {
    let scratch = ScratchFiles::new();
    let scratch_err = |path: &Path, source| ValidateError::Scratch {
        kernel: kernel.to_string(),
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&scratch.ptx, ptx).map_err(|e| scratch_err(&scratch.ptx, e))?;
    let out = Command::new(tool)
        .arg(format!("-arch={arch}"))
        .args(["-v", "--warn-on-spills", "-o"])
        .arg(&scratch.cubin)
        .arg(&scratch.ptx)
        .output()
        .map_err(|source| ValidateError::ToolMissing {
            tool: tool.display().to_string(),
            source,
        })?;
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        // Name the kernel instead of the scratch path, which is gone once this returns.
        let message = text.replace(&scratch.ptx.display().to_string(), &format!("{kernel}.ptx"));
        return Err(ValidateError::Invalid {
            kernel: kernel.to_string(),
            arch: arch.to_string(),
            message,
        });
    }
    let mut report = parse_report(&text);
    report.cubin = std::fs::read(&scratch.cubin).map_err(|e| scratch_err(&scratch.cubin, e))?;
    Ok(report)
}

/// Reads the `-v` lines: `ptxas info    : Used 168 registers, used 1 barriers, 40960 bytes
/// smem, ...`, `    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads`, and
/// `ptxas warning : ...` (with the info lines that announce a performance loss). Unknown
/// lines and fields are ignored, so a newer ptxas that adds fields still parses.
fn parse_report(text: &str) -> PtxasReport {
    let mut report = PtxasReport::default();
    for line in text.lines() {
        let info = line.strip_prefix("ptxas info");
        let warning = line
            .strip_prefix("ptxas warning")
            .or_else(|| info.filter(|rest| rest.contains("Potential Performance Loss")));
        if let Some(rest) = warning {
            let message = rest.trim_start().trim_start_matches(':').trim();
            report.warnings.push(message.to_string());
            continue;
        }
        // Info lines carry the prefix; the function-properties line is indented without one.
        let fields = match info {
            Some(rest) => rest.trim_start().trim_start_matches(':'),
            None if line.starts_with(char::is_whitespace) => line,
            None => continue,
        };
        for field in fields.split(',') {
            let field = field.trim();
            let field = field
                .strip_prefix("Used ")
                .or_else(|| field.strip_prefix("used "))
                .unwrap_or(field);
            let Some((count, unit)) = field.split_once(' ') else {
                continue;
            };
            let Ok(count) = count.parse::<u32>() else {
                continue;
            };
            let slot = match unit.trim() {
                "registers" => &mut report.registers,
                "bytes smem" => &mut report.shared_bytes,
                "bytes stack frame" => &mut report.stack_frame,
                "bytes spill stores" => &mut report.spill_stores,
                "bytes spill loads" => &mut report.spill_loads,
                _ => continue,
            };
            *slot = (*slot).max(count);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD_ONE: &str = "\
.version 8.0
.target sm_90
.address_size 64

.visible .entry add_one(.param .u64 p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    ld.global.u32 %r1, [%rd2];
    add.u32 %r1, %r1, 1;
    st.global.u32 [%rd2], %r1;
    ret;
}
";

    #[test]
    fn valid_kernel_assembles() {
        let report = ptxas("add_one", ADD_ONE, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
        assert!(report.registers > 0, "{report:?}");
        assert_eq!(report.spill_stores, 0);
        assert_eq!(report.spill_loads, 0);
        assert_eq!(report.shared_bytes, 0);
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        assert!(report.cubin.starts_with(b"\x7fELF"), "cubin is not an ELF");
    }

    #[test]
    fn a_cubin_disassembles() {
        let report = ptxas("add_one", ADD_ONE, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
        let text = sass("add_one", &report.cubin).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains("IADD") || text.contains("VIADD"), "{text}");
        assert!(matches!(
            sass("garbage", b"not an elf"),
            Err(ValidateError::Disassembly { .. })
        ));
    }

    #[test]
    fn typo_is_rejected_with_the_ptxas_message() {
        let ptx = ADD_ONE.replace("add.u32", "addd.u32");
        match ptxas("add_one", &ptx, "sm_90a") {
            Err(ValidateError::Invalid {
                kernel,
                arch,
                message,
            }) => {
                assert_eq!(kernel, "add_one");
                assert_eq!(arch, "sm_90a");
                assert!(message.contains("addd"), "{message}");
                assert!(message.contains("add_one.ptx"), "{message}");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn missing_tool_says_how_to_install_it() {
        let tool = Path::new("/nonexistent/helios/ptxas");
        match ptxas_with(tool, "add_one", ADD_ONE, "sm_90a") {
            Err(e @ ValidateError::ToolMissing { .. }) => {
                let text = e.to_string();
                assert!(text.contains("/nonexistent/helios/ptxas"), "{text}");
                assert!(text.contains("scripts/deps.sh test"), "{text}");
                assert!(text.contains("HELIOS_PTXAS"), "{text}");
            }
            other => panic!("expected ToolMissing, got {other:?}"),
        }
    }

    #[test]
    fn parses_verbose_output() {
        let text = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
ptxas info    : Function properties for gemm
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas warning : Registers are spilled to local memory in function 'gemm', 8 bytes spill stores, 4 bytes spill loads
ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage in the function 'gemm'
ptxas info    : Used 168 registers, used 1 barriers, 40960 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 1.830 ms
";
        let report = parse_report(text);
        assert_eq!(
            report,
            PtxasReport {
                registers: 168,
                spill_stores: 8,
                spill_loads: 4,
                stack_frame: 16,
                shared_bytes: 40960,
                warnings: vec![
                    "Registers are spilled to local memory in function 'gemm', 8 bytes spill \
                     stores, 4 bytes spill loads"
                        .to_string(),
                    "(C7513) Potential Performance Loss: wgmma.mma_async instructions are \
                     serialized due to non wgmma instructions defining input registers of a \
                     wgmma between start and end of the pipeline stage in the function 'gemm'"
                        .to_string(),
                ],
                cubin: Vec::new(),
            }
        );
    }
}
