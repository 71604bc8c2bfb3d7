use std::sync::Arc;

use helios::Device;
use helios_vk::{Context, ContextOptions, Instance, InstanceOptions};

use crate::{Rank, Result};

/// The device this rank trains on: `HELIOS_DEVICE` when set (every rank takes it), else
/// the local rank's device among the best kind present (the discrete GPUs, in enumeration
/// order), so the ranks on a host spread over its GPUs. Ranks beyond the devices present
/// share them (a CPU device, or tests).
pub fn device_for(rank: &Rank) -> Result<Device> {
    if rank.world == 1 || crate::env::device_chosen() {
        return Ok(Device::from_env()?);
    }
    let instance = Arc::new(Instance::new(&InstanceOptions::from_env()?)?);
    let adapters = instance.adapters()?;
    let best = helios_vk::select_adapter(&adapters, None)?
        .caps()
        .device_type
        .preference();
    let kind: Vec<_> = adapters
        .iter()
        .filter(|a| a.caps().device_type.preference() == best)
        .collect();
    let adapter = kind[rank.local_rank % kind.len()];
    let ctx = Context::with_options(instance.clone(), adapter, &ContextOptions::from_env()?)?;
    Ok(Device::new(ctx))
}
