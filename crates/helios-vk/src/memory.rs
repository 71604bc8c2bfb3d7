//! Buffers: regions of device memory.
//!
//! Memory comes from the driver in large blocks (block.rs: one VkDeviceMemory + one VkBuffer
//! spanning it, reachable by device address), and a `Buffer` is a region of a block handed
//! out by the caching pool (pool.rs), or a region of an exported allocation (external.rs),
//! which never goes back to the pool. A buffer's device address is the block's plus its
//! offset, so kernels never see the difference. Host-visible blocks (and device-local ones on
//! unified memory, where device-local memory is host-visible) are mapped once for their whole
//! life.
//!
//! Each buffer remembers the timeline values of its last write and last use by the GPU
//! (recorded by the encoder); host reads wait for the first, host writes and the pool's
//! reuse for host access wait for the second.

use ash::vk;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::block::{Allocated, Block, MemoryLocation};
use crate::core::Core;
use crate::error::{vk_err, Error, Result};
use crate::owner::Owner;
use crate::pool::Grant;

/// Timeline values of the last GPU accesses to some memory.
#[derive(Default)]
pub(crate) struct Marks {
    /// Timeline value of the batch that last wrote it (0: none).
    last_write: AtomicU64,
    /// Timeline value of the batch that last read or wrote it (0: none).
    last_use: AtomicU64,
    /// Transfer-timeline value of the last copy-queue copy that touched it (0: none).
    transfer_use: AtomicU64,
}

impl Marks {
    fn new(last_use: u64, transfer_use: u64) -> Marks {
        Marks {
            last_write: AtomicU64::new(0),
            last_use: AtomicU64::new(last_use),
            transfer_use: AtomicU64::new(transfer_use),
        }
    }

    pub(crate) fn last_use(&self) -> u64 {
        self.last_use.load(Ordering::Acquire)
    }

    pub(crate) fn transfer_use(&self) -> u64 {
        self.transfer_use.load(Ordering::Acquire)
    }
}

/// Where a buffer's region came from, and so where it goes when the buffer is dropped.
pub(crate) enum Origin {
    /// Carved by the caching pool (pool.rs), and returned to it.
    Pool,
    /// A region of an exported allocation (external.rs), which is freed once it and every
    /// region are gone and never reaches the pool. Regions may overlap, so their accesses are
    /// tracked for the whole allocation: in the allocation's `Marks`, and in the encoder
    /// under one key.
    Exported(Arc<ExportedBlock>),
}

/// The allocation behind an `ExportedMemory` (external.rs) and its regions (each holds it).
pub(crate) struct ExportedBlock {
    ctx: Arc<dyn Owner>,
    block: Arc<Block>,
    /// GPU accesses through any region.
    marks: Marks,
    allocated: Allocated,
}

impl ExportedBlock {
    pub(crate) fn new(ctx: Arc<dyn Owner>, block: Block, allocated: Allocated) -> ExportedBlock {
        ExportedBlock {
            ctx,
            block: Arc::new(block),
            marks: Marks::default(),
            allocated,
        }
    }

    pub(crate) fn context(&self) -> &Arc<dyn Owner> {
        &self.ctx
    }

    pub(crate) fn block(&self) -> &Arc<Block> {
        &self.block
    }

    pub(crate) fn marks(&self) -> &Marks {
        &self.marks
    }

    /// The allocation's size and memory type (what an importer repeats).
    pub(crate) fn allocated(&self) -> Allocated {
        self.allocated
    }
}

impl Drop for ExportedBlock {
    fn drop(&mut self) {
        let ctx = &self.ctx;
        ctx.pools()
            .exported_bytes
            .fetch_sub(self.allocated.size, Ordering::Relaxed);
        // Freeing memory the GPU still uses is illegal: wait for the last use on both queues.
        let compute = self.marks.last_use();
        let idle = match compute {
            0 => Ok(()),
            v => ctx.wait(v),
        }
        .and_then(|_| ctx.wait_copies(self.marks.transfer_use()));
        match idle {
            // SAFETY: no region is left (each holds this), the GPU is done with the memory.
            Ok(()) => unsafe { self.block.destroy(ctx.core().device()) },
            // A drop inside a recording closure, or a lost device: freed with the Context,
            // after it waited for the device to go idle.
            Err(_) => ctx.pools().defer_destroy(Arc::clone(&self.block)),
        }
    }
}

/// A region of device memory: what tensors and staging areas are made of.
pub struct Buffer {
    ctx: Arc<dyn Owner>,
    pub(crate) block: Arc<Block>,
    /// Byte offset of the region in its block.
    pub(crate) offset: u64,
    /// Bytes reserved in the block (the size class, ≥ `size`).
    pub(crate) class: u64,
    /// Size the caller asked for (may be 0).
    size: u64,
    location: MemoryLocation,
    /// The last GPU accesses (of a pool region; an exported region's are its allocation's).
    marks: Marks,
    origin: Origin,
    /// The region was cut from a different extent than its previous occupants and has not
    /// been fenced yet (see `take_remapped`).
    remapped: AtomicBool,
}

impl Buffer {
    /// A buffer over a granted region. It inherits the region's last GPU use, so a host
    /// write waits for the previous owner's GPU work (GPU work is ordered by the encoder).
    pub(crate) fn new(
        ctx: Arc<dyn Owner>,
        grant: Grant,
        size: u64,
        location: MemoryLocation,
    ) -> Buffer {
        Buffer {
            ctx,
            block: grant.block,
            offset: grant.offset,
            class: grant.class,
            size,
            location,
            marks: Marks::new(grant.free_after, grant.transfer_after),
            origin: Origin::Pool,
            remapped: AtomicBool::new(grant.remapped),
        }
    }

    /// A buffer over `[offset, offset + size)` of an exported allocation, `class` bytes of
    /// it reserved (what descriptors may bind). The caller checked the range and alignment.
    pub(crate) fn exported_region(
        exported: &Arc<ExportedBlock>,
        offset: u64,
        size: u64,
        class: u64,
    ) -> Buffer {
        Buffer {
            ctx: Arc::clone(exported.context()),
            block: Arc::clone(exported.block()),
            offset,
            class,
            size,
            location: MemoryLocation::DeviceLocal,
            marks: Marks::default(),
            origin: Origin::Exported(Arc::clone(exported)),
            remapped: AtomicBool::new(false),
        }
    }

    /// The marks that track this buffer's GPU accesses.
    fn marks(&self) -> &Marks {
        match &self.origin {
            Origin::Pool => &self.marks,
            Origin::Exported(e) => e.marks(),
        }
    }

    /// The encoder's key for hazards on this buffer: its pool region, or the whole exported
    /// allocation (whose regions may overlap; byte ranges are tracked within the key).
    pub(crate) fn hazard_key(&self) -> (u64, u64) {
        match self.origin {
            Origin::Pool => (self.block.id, self.offset),
            Origin::Exported(_) => (self.block.id, 0),
        }
    }

    /// Size in bytes as requested at creation.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// GPU address of byte 0, for push constants (`PhysicalStorageBuffer` pointers).
    pub fn device_address(&self) -> u64 {
        self.block.address + self.offset
    }

    pub fn location(&self) -> MemoryLocation {
        self.location
    }

    /// True when the host can read and write it in place (host-visible, or device-local on
    /// unified memory).
    pub fn is_mapped(&self) -> bool {
        self.block.is_mapped()
    }

    /// The VkBuffer the region lives in (shared with other regions of the block).
    pub fn raw(&self) -> vk::Buffer {
        self.block.raw
    }

    /// Byte offset of this buffer inside `raw()`.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Timeline value of the last GPU write (0: never written by the GPU).
    pub fn last_write(&self) -> u64 {
        self.marks().last_write.load(Ordering::Acquire)
    }

    /// Timeline value of the last GPU read or write.
    pub fn last_use(&self) -> u64 {
        self.marks().last_use()
    }

    /// Whether this is the first GPU use of a region cut from a different extent than its
    /// previous occupants (a split or merged large region). The encoder tracks hazards per
    /// region, so such a region's overlap with accesses to the old extents in the open batch
    /// is invisible to it: it fences everything before the first use instead.
    pub(crate) fn take_remapped(&self) -> bool {
        self.remapped.load(Ordering::Relaxed) && self.remapped.swap(false, Ordering::AcqRel)
    }

    /// Records a GPU access in the batch that will signal `value`.
    pub(crate) fn mark(&self, value: u64, write: bool) {
        let marks = self.marks();
        marks.last_use.fetch_max(value, Ordering::AcqRel);
        if write {
            marks.last_write.fetch_max(value, Ordering::AcqRel);
        }
    }

    /// Transfer-timeline value of the last copy-queue copy that read or wrote it.
    pub fn transfer_use(&self) -> u64 {
        self.marks().transfer_use()
    }

    /// Records a copy-queue copy that signals `value` on the transfer timeline.
    pub(crate) fn mark_transfer(&self, value: u64) {
        self.marks().transfer_use.fetch_max(value, Ordering::AcqRel);
    }

    /// The device core of the Context it was made on (for checking that it is that one).
    pub(crate) fn core(&self) -> &Core {
        self.ctx.core()
    }

    /// Errors unless `[offset, offset + len)` lies inside the buffer's requested size.
    pub(crate) fn check_range(&self, what: &'static str, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRange {
                what,
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// `offset` is inside the region, which is inside the block.
    fn map_ptr(&self, offset: u64) -> Option<(*mut u8, bool)> {
        self.block.map_ptr(self.offset + offset)
    }

    fn mapped_range(&self) -> vk::MappedMemoryRange<'static> {
        self.block.mapped_range()
    }

    /// Copies host bytes into the mapping. The caller checked the range, that the buffer is
    /// mapped, and that the GPU no longer uses it.
    #[track_caller]
    pub(crate) fn write_mapped(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        debug_assert!(offset + bytes.len() as u64 <= self.size, "unchecked range");
        let Some((ptr, coherent)) = self.map_ptr(offset) else {
            debug_assert!(false, "write_mapped on an unmapped buffer");
            return Ok(());
        };
        // SAFETY: range checked by the caller; the GPU is done with the region.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        if !coherent {
            // SAFETY: memory is mapped; a whole-size range from offset 0 is always aligned.
            unsafe {
                self.ctx
                    .core()
                    .device()
                    .flush_mapped_memory_ranges(&[self.mapped_range()])
            }
            .map_err(vk_err("vkFlushMappedMemoryRanges"))?;
        }
        Ok(())
    }

    /// Copies from the mapping into `out`. The caller checked the range and waited for the
    /// last GPU write.
    #[track_caller]
    pub(crate) fn read_mapped(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        debug_assert!(offset + out.len() as u64 <= self.size, "unchecked range");
        let Some((ptr, coherent)) = self.map_ptr(offset) else {
            debug_assert!(false, "read_mapped on an unmapped buffer");
            return Ok(());
        };
        if !coherent {
            // SAFETY: as in write_mapped.
            unsafe {
                self.ctx
                    .core()
                    .device()
                    .invalidate_mapped_memory_ranges(&[self.mapped_range()])
            }
            .map_err(vk_err("vkInvalidateMappedMemoryRanges"))?;
        }
        // SAFETY: as in write_mapped.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // An exported region holds its allocation, which frees itself (ExportedBlock).
        if let Origin::Exported(_) = self.origin {
            return;
        }
        // The region goes back to the pool tagged with its last GPU use: later GPU work on
        // the queue may take it at once (the encoder orders the accesses), host access only
        // once that value has completed.
        let (last_use, transfer_use) = (self.last_use(), self.transfer_use());
        self.ctx.pools().free(
            self.location,
            Arc::clone(&self.block),
            self.offset,
            self.class,
            last_use,
            transfer_use,
        );
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("size", &self.size)
            .field("location", &self.location)
            .field("address", &format_args!("{:#x}", self.device_address()))
            .finish()
    }
}
