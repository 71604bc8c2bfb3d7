//! Environment switches read by helios-vk, all in one place.
//!
//! They are read only where an `*::from_env()` constructor asks for them, so that library
//! users who build options by hand are never surprised by the environment.

use crate::error::{Error, Result};

/// `HELIOS_VALIDATION=1` turns on the Khronos validation layer with synchronization
/// validation; messages are collected on the `Instance`.
pub const HELIOS_VALIDATION: &str = "HELIOS_VALIDATION";

/// `HELIOS_DEVICE=<index>` or `HELIOS_DEVICE=<part of the name>` picks the Vulkan device.
pub const HELIOS_DEVICE: &str = "HELIOS_DEVICE";

/// Reads a boolean switch: unset or empty is `None`; `1/true/yes/on` and `0/false/no/off`
/// (any case) are accepted; anything else is an error rather than a silent default.
pub fn flag(name: &'static str) -> Result<Option<bool>> {
    let Some(value) = std::env::var_os(name) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().trim().to_ascii_lowercase();
    match value.as_str() {
        "" => Ok(None),
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(Error::BadEnvVar {
            name,
            value,
            expected: "use 1 (on) or 0 (off)",
        }),
    }
}

/// Reads a string variable; unset or blank is `None`.
pub fn string(name: &str) -> Option<String> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

/// `HELIOS_COOPMAT2=0`: leave VK_NV_cooperative_matrix2 off.
pub const HELIOS_COOPMAT2: &str = "HELIOS_COOPMAT2";

/// `HELIOS_BATCH=<n>`: dispatches per submitted batch (default 256; 1 submits each alone).
pub const HELIOS_BATCH: &str = "HELIOS_BATCH";

/// `HELIOS_SPIN_US=<µs>`: how long a host wait polls the timeline before sleeping.
pub const HELIOS_SPIN_US: &str = "HELIOS_SPIN_US";

/// `HELIOS_MEMORY_LIMIT=<bytes>` (K, M or G suffix: powers of 1024): device-local memory
/// the pool may hold at most, below what the device has (tests of out-of-memory handling;
/// sharing a GPU).
pub const HELIOS_MEMORY_LIMIT: &str = "HELIOS_MEMORY_LIMIT";

/// Reads a byte count with an optional K/M/G suffix; unset or blank is `None`.
pub fn bytes(name: &'static str) -> Result<Option<u64>> {
    let Some(v) = string(name) else {
        return Ok(None);
    };
    parse_bytes(&v).map(Some).ok_or(Error::BadEnvVar {
        name,
        value: v,
        expected: "a byte count such as 512M or 2G",
    })
}

/// `512`, `64K`, `512M`, `2G` (powers of 1024) as bytes.
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let (digits, shift) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&v[..v.len() - 1], 10),
        Some('M') => (&v[..v.len() - 1], 20),
        Some('G') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Reads an unsigned integer; unset or blank gives `default`.
pub fn u32_or(name: &'static str, default: u32) -> Result<u32> {
    Ok(u32_opt(name)?.unwrap_or(default))
}

/// `name` as an unsigned integer, `None` where it is unset.
pub fn u32_opt(name: &'static str) -> Result<Option<u32>> {
    string(name)
        .map(|v| {
            v.parse().map_err(|_| Error::BadEnvVar {
                name,
                value: v,
                expected: "an unsigned integer",
            })
        })
        .transpose()
}

/// `HELIOS_TRANSFER_QUEUE=0`: staged copies stay on the compute queue.
pub const HELIOS_TRANSFER_QUEUE: &str = "HELIOS_TRANSFER_QUEUE";

/// `HELIOS_SUBMIT_THREAD=0|1`: command buffers recorded and submitted on the recording
/// thread, or on a thread of their own (default: their own thread on GPUs, not on CPU
/// devices, where it competes with the device's threads).
pub const HELIOS_SUBMIT_THREAD: &str = "HELIOS_SUBMIT_THREAD";

/// `HELIOS_BAR=0`: device-local buffers never use the host-visible (BAR) memory type.
pub const HELIOS_BAR: &str = "HELIOS_BAR";

/// `HELIOS_NATIVE=0`: leave VK_NVX_binary_import off, so native (PTX) kernels are never
/// created even where the driver offers them.
pub const HELIOS_NATIVE: &str = "HELIOS_NATIVE";

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("512"), Some(512));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes(" 384M "), Some(384 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        for bad in ["", "M", "1.5G", "-1", "12T", "99999999999999999999G"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }
}
