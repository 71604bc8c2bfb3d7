//! The environment switches helios-field reads, all in one place (documented in
//! `docs/ENVIRONMENT.md`).
//!
//! They are read only by [`FieldConfig::from_env`](crate::FieldConfig::from_env), so a library
//! user who builds a config by hand is never surprised by the environment.

use crate::arith::Layout;
use crate::{FieldError, Result};

/// `HELIOS_FIELD_DEVICE_LOCAL=1` keeps arrays and the one-shot API's scratch in device-local
/// memory reached through staging copies; `0` uses host-visible memory the GPU reads directly.
pub const HELIOS_FIELD_DEVICE_LOCAL: &str = "HELIOS_FIELD_DEVICE_LOCAL";

/// `HELIOS_FIELD_LAYOUT=<name>`: the in-shader multiplier (`Layout::name`: comba30k2h, the
/// default; comba30kh, whose array mul and sqr ran up to 4% faster; u32mix, the schoolbook
/// baseline).
pub const HELIOS_FIELD_LAYOUT: &str = "HELIOS_FIELD_LAYOUT";

/// `HELIOS_FIELD_WORKGROUP=<n>`: invocations per workgroup.
pub const HELIOS_FIELD_WORKGROUP: &str = "HELIOS_FIELD_WORKGROUP";

/// `HELIOS_FIELD_CHAIN_CANONICAL=1`: the chain probe makes every intermediate product
/// canonical (measurement; the default `0` keeps them below 2p, with the same result).
pub const HELIOS_FIELD_CHAIN_CANONICAL: &str = "HELIOS_FIELD_CHAIN_CANONICAL";

pub fn chain_canonical() -> Result<Option<bool>> {
    Ok(helios_vk::env::flag(HELIOS_FIELD_CHAIN_CANONICAL)?)
}

pub fn device_local() -> Result<Option<bool>> {
    Ok(helios_vk::env::flag(HELIOS_FIELD_DEVICE_LOCAL)?)
}

pub fn layout() -> Result<Option<Layout>> {
    match helios_vk::env::string(HELIOS_FIELD_LAYOUT) {
        None => Ok(None),
        Some(v) => Layout::from_name(&v)
            .map(Some)
            .ok_or(FieldError::BadEnvVar {
                name: HELIOS_FIELD_LAYOUT,
                value: v,
                expected: "use a layout name: comba30k2h (the default), comba30kh or u32mix",
            }),
    }
}

pub fn workgroup() -> Result<Option<u32>> {
    match helios_vk::env::string(HELIOS_FIELD_WORKGROUP) {
        None => Ok(None),
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(Some(n)),
            _ => Err(FieldError::BadEnvVar {
                name: HELIOS_FIELD_WORKGROUP,
                value: v,
                expected: "use a whole number from 1 to 1024 (e.g. 128)",
            }),
        },
    }
}
