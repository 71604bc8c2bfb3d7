//! Cooperative-matrix attention kernels (f16/bf16, f32 accumulation).

use helios_spirv::KernelModule;

use crate::attention::AttentionKernel;

pub(crate) fn shared_bytes(_kern: &AttentionKernel) -> u32 {
    0
}

pub(crate) fn build(_kern: &AttentionKernel) -> KernelModule {
    unimplemented!()
}
