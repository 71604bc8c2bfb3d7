//! Runs Khronos `spirv-val` on emitted modules. Tests call it on every module the kernel
//! library can emit. The validator is `HELIOS_SPIRV_VAL` when set, else the project's own
//! `.tools/bin/spirv-val` (a current SPIRV-Tools that `scripts/deps.sh test` installs); never
//! whatever `spirv-val` happens to be on `PATH`, whose age would decide what can be checked.
//! A module that cannot be validated is an error, not a skip.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The Vulkan environment a module is validated against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetEnv {
    Vulkan1_2,
    Vulkan1_3,
}

impl TargetEnv {
    pub const fn flag(self) -> &'static str {
        match self {
            TargetEnv::Vulkan1_2 => "vulkan1.2",
            TargetEnv::Vulkan1_3 => "vulkan1.3",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(
        "cannot run spirv-val `{tool}`: {source}. Run `scripts/deps.sh test` (installs SPIRV-Tools \
         2025.5 into .tools/bin) or point HELIOS_SPIRV_VAL at a SPIRV-Tools 2024.1+ spirv-val"
    )]
    ToolMissing {
        tool: String,
        source: std::io::Error,
    },
    #[error("spirv-val ({env}) rejected kernel `{kernel}`:\n{message}")]
    Invalid {
        kernel: String,
        env: &'static str,
        message: String,
    },
}

/// The `spirv-val` binary: `HELIOS_SPIRV_VAL`, else `<workspace>/.tools/bin/spirv-val`.
pub fn validator() -> PathBuf {
    match std::env::var_os("HELIOS_SPIRV_VAL") {
        Some(tool) if !tool.is_empty() => PathBuf::from(tool),
        _ => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../.tools/bin/spirv-val"
        )),
    }
}

/// With `HELIOS_SPIRV_DIGEST=<file>`, appends `<kernel> <hash of its words>` for every module
/// validated: a refactoring that must not change kernels (issue 48) diffs the sorted file
/// before and after, as tinygrad's "process replay" does.
fn record_digest(kernel: &str, words: &[u32]) {
    use std::hash::{Hash, Hasher};
    let Some(path) = std::env::var_os("HELIOS_SPIRV_DIGEST") else {
        return;
    };
    // SipHash with fixed keys: the same words give the same digest in every run.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    words.hash(&mut h);
    let line = format!("{kernel} {:016x}\n", h.finish());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path);
    // One write per line with O_APPEND: lines from parallel tests do not interleave.
    if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
        eprintln!("HELIOS_SPIRV_DIGEST: cannot append to {path:?}: {e}");
    }
}

/// Validates `words` (named `kernel` in messages) for `env`.
pub fn validate(kernel: &str, words: &[u32], env: TargetEnv) -> Result<(), ValidateError> {
    record_digest(kernel, words);
    let tool = validator().display().to_string();
    let spawn = Command::new(&tool)
        .args(["--target-env", env.flag(), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = spawn.map_err(|source| ValidateError::ToolMissing {
        tool: tool.clone(),
        source,
    })?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(&bytes)
        .map_err(|source| ValidateError::ToolMissing {
            tool: tool.clone(),
            source,
        })?;
    let out = child
        .wait_with_output()
        .map_err(|source| ValidateError::ToolMissing {
            tool: tool.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let mut message = String::from_utf8_lossy(&out.stderr).into_owned();
        message.push_str(&String::from_utf8_lossy(&out.stdout));
        Err(ValidateError::Invalid {
            kernel: kernel.to_string(),
            env: env.flag(),
            message,
        })
    }
}
