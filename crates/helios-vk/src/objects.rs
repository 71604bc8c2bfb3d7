//! What a Context makes, and its memory counters: buffers from its pools, exported memory and
//! timelines, pipelines and native kernels. Each constructor forwards to the module of its
//! object, which holds the Context as an `Owner` (owner.rs) and takes the device core.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::block::MemoryLocation;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::external::{self, ExportedMemory, ExternalTimeline};
use crate::memory::Buffer;
use crate::native::NativeKernel;
use crate::pipeline::{Pipeline, PipelineDesc};
use crate::pool::{Completed, Grant, MemoryStats};

impl Context {
    /// A buffer of `size` bytes (0 allowed) from the caching pool.
    pub fn create_buffer(self: &Arc<Self>, size: u64, location: MemoryLocation) -> Result<Buffer> {
        let limits = &self.caps().limits;
        if let Some(max) = limits.max_buffer_size {
            if size > max {
                return Err(Error::BufferTooLarge {
                    requested: size,
                    limit: max,
                    limit_name: "maxBufferSize",
                });
            }
        }
        let grant = self.pool_alloc(size, location, false)?;
        Ok(Buffer::new(self.clone(), grant, size, location))
    }

    /// A buffer the host may write at once (its region is no longer used by the GPU).
    pub(crate) fn create_host_buffer(
        self: &Arc<Self>,
        size: u64,
        location: MemoryLocation,
    ) -> Result<Buffer> {
        let grant = self.pool_alloc(size, location, true)?;
        Ok(Buffer::new(self.clone(), grant, size, location))
    }

    /// A region of at least `size` bytes (pool.rs).
    fn pool_alloc(&self, size: u64, location: MemoryLocation, host_access: bool) -> Result<Grant> {
        let timelines = || self.completed_both();
        self.pools
            .alloc(&self.core, size, location, host_access, timelines)
    }

    fn completed_both(&self) -> Result<Completed> {
        Ok(Completed {
            compute: self.completed()?,
            transfer: self.copies_completed()?,
        })
    }

    /// Allocation counters, summed over device-local and host-visible memory, and the bytes
    /// of exported allocations.
    pub fn memory_stats(&self) -> MemoryStats {
        self.pools.stats()
    }

    /// Starts `peak_in_use` again from what is in use now.
    pub fn reset_peak_memory(&self) {
        self.pools.reset_peak()
    }

    /// Returns cached memory whose last use has completed to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        let completed = self.completed_both()?;
        self.pools.empty(&self.core, completed);
        Ok(())
    }

    /// An allocation of `size` bytes exportable as an opaque fd: dedicated, device-local,
    /// with one buffer of the usage every Helios buffer has (storage, transfers, device
    /// address). Errors where the driver cannot export (see `EnabledFeatures::export_memory`).
    pub fn export_memory(self: &Arc<Self>, size: u64) -> Result<ExportedMemory> {
        external::export_memory(self.clone(), size, || self.empty_cache())
    }

    /// The alignment of exported regions: `REGION_ALIGN` or the device's
    /// minStorageBufferOffsetAlignment, whichever is larger.
    pub fn region_alignment(&self) -> u64 {
        external::region_alignment(&self.core)
    }

    /// A timeline semaphore (initial value 0) exportable as an opaque fd, for another API to
    /// import (`ExternalTimeline::fd`). Errors where the driver cannot export one (see
    /// `EnabledFeatures::export_timeline`).
    pub fn export_timeline(&self) -> Result<ExternalTimeline> {
        external::export_timeline(self.owner())
    }

    /// A timeline semaphore (initial value 0) that is not exportable, on any device: for
    /// ordering Helios's work against the host or another thread (`ExternalTimeline::signal`)
    /// with the same calls as an exported one.
    pub fn create_timeline(&self) -> Result<ExternalTimeline> {
        external::new_timeline(self.owner(), false)
    }

    /// A timeline semaphore whose payload is the one behind `fd` (an opaque fd from
    /// `ExternalTimeline::fd` of another device or process, or from CUDA): waits and signals
    /// here order against the other side's. The fd is consumed, also on failure.
    pub fn import_timeline(&self, fd: OwnedFd) -> Result<ExternalTimeline> {
        external::import_timeline(self.owner(), fd)
    }

    /// A compute pipeline, compiled before this returns (see `create_pipeline_deferred`).
    pub fn create_pipeline(self: &Arc<Self>, desc: &PipelineDesc<'_>) -> Result<Arc<Pipeline>> {
        Pipeline::create(self.clone(), desc)
    }

    /// A compute pipeline whose compile runs on a pool of threads: it can be recorded at
    /// once, and the batch that uses it waits for it when it is submitted (the submit
    /// thread's wait, not the recording thread's). A program's first step asks for a hundred
    /// pipelines one after another; a cold driver takes ~0.1 s for each, so compiling them
    /// side by side is most of the first step's time saved. A compile that fails fails the
    /// submit of the batch that uses it.
    pub fn create_pipeline_deferred(
        self: &Arc<Self>,
        desc: &PipelineDesc<'_>,
    ) -> Result<Arc<Pipeline>> {
        Pipeline::create_deferred(self.clone(), desc)
    }

    /// Whether `create_native_kernel` can work here (VK_NVX_binary_import is enabled).
    pub fn has_native_kernels(&self) -> bool {
        self.core.native.is_some()
    }

    /// Compiles `ptx` (PTX text, as `ptxas` would take it) with the driver's JIT and looks up
    /// its `.entry` called `entry`. `name` is shown in errors and profiles.
    pub fn create_native_kernel(
        self: &Arc<Self>,
        ptx: &str,
        entry: &str,
        name: &str,
    ) -> Result<Arc<NativeKernel>> {
        NativeKernel::create(self.clone(), ptx, entry, name)
    }

    /// `create_native_kernel` with the JIT on the native lane of the compile pool: it can be
    /// launched at once, and the batch that launches it waits for it when submitted (as
    /// deferred pipelines do). The lane JIT-compiles one module at a time, the `urgent` ones
    /// (a program about to launch them) before the others. A JIT that fails fails that
    /// batch's submit.
    pub fn create_native_kernel_deferred(
        self: &Arc<Self>,
        ptx: &str,
        entry: &str,
        name: &str,
        urgent: bool,
    ) -> Result<Arc<NativeKernel>> {
        NativeKernel::create_deferred(self.clone(), ptx, entry, name, urgent)
    }
}
