//! Block-size autotuning of the attention kernels per (device, head dim, dtype, stage).

use helios_kernels::attention::{AttnStage, AttnVariant};
use helios_kernels::Storage;

use crate::Device;

/// The tuned variant cached for this device, if any.
pub(crate) fn cached(
    _device: &Device,
    _storage: Storage,
    _head_dim: u32,
    _stage: AttnStage,
) -> Option<AttnVariant> {
    None
}
