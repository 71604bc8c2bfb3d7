//! What a Context makes and how its memory is counted: the public constructors of buffers
//! (and the rest below), forwarding to the modules that make them, which take the device
//! core and the Context's parts instead of the Context.

use std::sync::Arc;

use crate::block::MemoryLocation;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::memory::Buffer;
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
        Ok(Buffer::new(self, grant, size, location))
    }

    /// A buffer the host may write at once (its region is no longer used by the GPU).
    pub(crate) fn create_host_buffer(
        self: &Arc<Self>,
        size: u64,
        location: MemoryLocation,
    ) -> Result<Buffer> {
        let grant = self.pool_alloc(size, location, true)?;
        Ok(Buffer::new(self, grant, size, location))
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
}
