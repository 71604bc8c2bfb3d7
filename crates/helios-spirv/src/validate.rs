//! Runs Khronos `spirv-val` on emitted modules. Tests call it on every module the kernel
//! library can emit; `HELIOS_SPIRV_VAL` names another binary (e.g. a newer one that knows
//! cooperative matrices).

use std::io::Write;
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
        "cannot run `{tool}`: {source}. Install it (Debian/Ubuntu: apt-get install spirv-tools) \
         or point HELIOS_SPIRV_VAL at a spirv-val binary"
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

/// Validates `words` (named `kernel` in messages) for `env`.
pub fn validate(kernel: &str, words: &[u32], env: TargetEnv) -> Result<(), ValidateError> {
    let tool = std::env::var("HELIOS_SPIRV_VAL").unwrap_or_else(|_| "spirv-val".to_string());
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
