//! Buffers and the memory behind them.
//!
//! Memory comes from the driver in large blocks (one VkDeviceMemory + one VkBuffer spanning
//! it, reachable by device address), and a `Buffer` is a region of a block handed out by the
//! caching pool (pool.rs), or a region of an exported allocation (external.rs), which never
//! goes back to the pool. A buffer's device address is the block's plus its offset, so
//! kernels never see the difference. Host-visible blocks (and device-local ones on unified
//! memory, where device-local memory is host-visible) are mapped once for their whole life.
//!
//! Each buffer remembers the timeline values of its last write and last use by the GPU
//! (recorded by the encoder); host reads wait for the first, host writes and the pool's
//! reuse for host access wait for the second.

use ash::vk;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::context::Context;
use crate::core::Core;
use crate::error::{vk_err, Error, Result};
use crate::pool::Grant;

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocation {
    /// Fastest for kernels; reached from the host through staging copies (or directly on
    /// unified memory).
    DeviceLocal,
    /// Mapped for the buffer's life; host-coherent (and host-cached when available, which
    /// makes read-back fast).
    HostVisible,
}

impl MemoryLocation {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryLocation::DeviceLocal => "device-local",
            MemoryLocation::HostVisible => "host-visible",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            MemoryLocation::DeviceLocal => 0,
            MemoryLocation::HostVisible => 1,
        }
    }
}

/// One driver allocation with a buffer over all of it.
pub(crate) struct Block {
    /// Unique per Context; identifies the block in hazard tracking.
    pub(crate) id: u64,
    pub(crate) raw: vk::Buffer,
    memory: vk::DeviceMemory,
    pub(crate) size: u64,
    pub(crate) address: u64,
    mapped: Option<Mapping>,
}

struct Mapping {
    ptr: NonNull<u8>,
    coherent: bool,
}

// SAFETY: the pointer is to device memory mapped for the block's whole life; every access
// is bounded by a buffer's range checks and ordered by the timeline.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Block {
    /// Allocates a block of `size` bytes in `location` from the pool (pool.rs).
    pub(crate) fn new(ctx: &Core, id: u64, size: u64, location: MemoryLocation) -> Result<Block> {
        Block::create(ctx, id, size, location, false).map(|(block, _)| block)
    }

    /// Allocates a dedicated device-local block of `size` bytes exportable as an opaque fd
    /// (external.rs); also returns the allocation's size and memory type, which an importer
    /// must repeat.
    pub(crate) fn new_exported(ctx: &Core, id: u64, size: u64) -> Result<(Block, Allocated)> {
        Block::create(ctx, id, size, MemoryLocation::DeviceLocal, true)
    }

    fn create(
        ctx: &Core,
        id: u64,
        size: u64,
        location: MemoryLocation,
        export: bool,
    ) -> Result<(Block, Allocated)> {
        let device = ctx.device();
        let mut external = vk::ExternalMemoryBufferCreateInfo::default()
            .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(crate::probe::BUFFER_USAGE)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let info = match export {
            true => info.push_next(&mut external),
            false => info,
        };
        // With a dedicated transfer queue, blocks are shared by both queue families, so
        // copies and kernels need no queue-family ownership transfers.
        let families = ctx.queue_families();
        let info = if families.len() > 1 {
            info.sharing_mode(vk::SharingMode::CONCURRENT)
                .queue_family_indices(&families)
        } else {
            info
        };
        // SAFETY: valid device and create info.
        let raw = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| oom_or(r, "vkCreateBuffer", size, location))?;
        // SAFETY: `raw` was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(raw) };
        let dedicated = export.then_some(raw);
        let (memory, mapped, allocated) =
            match allocate(ctx, requirements, size, location, dedicated) {
                Ok(a) => a,
                Err(e) => {
                    // SAFETY: unused buffer of this device.
                    unsafe { device.destroy_buffer(raw, None) };
                    return Err(e);
                }
            };
        // SAFETY: the memory type was chosen from the buffer's requirements; offset 0.
        if let Err(r) = unsafe { device.bind_buffer_memory(raw, memory, 0) } {
            // SAFETY: neither object is in use.
            unsafe {
                device.destroy_buffer(raw, None);
                device.free_memory(memory, None);
            }
            return Err(oom_or(r, "vkBindBufferMemory", size, location));
        }
        let address_info = vk::BufferDeviceAddressInfo::default().buffer(raw);
        // SAFETY: bound buffer with SHADER_DEVICE_ADDRESS usage on a device with the feature.
        let address = unsafe { device.get_buffer_device_address(&address_info) };
        let what = if export {
            "exported"
        } else {
            location.as_str()
        };
        ctx.set_name(raw, &format!("helios block {id} ({what})"));
        let block = Block {
            id,
            raw,
            memory,
            size,
            address,
            mapped,
        };
        Ok((block, allocated))
    }

    /// Returns the memory to the driver.
    ///
    /// # Safety
    /// No GPU work may still use the block, and no `Buffer` may refer to it.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        device.destroy_buffer(self.raw, None);
        device.free_memory(self.memory, None);
    }

    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// The VkDeviceMemory (for exporting it as an fd).
    pub(crate) fn memory(&self) -> vk::DeviceMemory {
        self.memory
    }
}

/// What `allocate` got from the driver.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allocated {
    /// The VkDeviceMemory's size (the buffer's requirement, ≥ the size asked for).
    pub(crate) size: u64,
    pub(crate) memory_type: u32,
}

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
    Exported(Arc<crate::external::ExportedBlock>),
}

/// A region of device memory: what tensors and staging areas are made of.
pub struct Buffer {
    pub(crate) ctx: Arc<Context>,
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
}

impl Buffer {
    /// A buffer over a granted region. It inherits the region's last GPU use, so a host
    /// write waits for the previous owner's GPU work (GPU work is ordered by the encoder).
    fn new(ctx: &Arc<Context>, grant: Grant, size: u64, location: MemoryLocation) -> Buffer {
        Buffer {
            ctx: Arc::clone(ctx),
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
        exported: &Arc<crate::external::ExportedBlock>,
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

    pub(crate) fn context(&self) -> &Context {
        &self.ctx
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

    fn map_ptr(&self, offset: u64) -> Option<(*mut u8, bool)> {
        let map = self.block.mapped.as_ref()?;
        // SAFETY: offset is inside the region, which is inside the mapped block.
        Some((
            unsafe { map.ptr.as_ptr().add((self.offset + offset) as usize) },
            map.coherent,
        ))
    }

    fn mapped_range(&self) -> vk::MappedMemoryRange<'static> {
        vk::MappedMemoryRange::default()
            .memory(self.block.memory)
            .offset(0)
            .size(vk::WHOLE_SIZE)
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
        // An exported region holds its allocation, which frees itself (external.rs).
        if let Origin::Exported(_) = self.origin {
            return;
        }
        // The region goes back to the pool tagged with its last GPU use: later GPU work on
        // the queue may take it at once (the encoder orders the accesses), host access only
        // once that value has completed.
        let (last_use, transfer_use) = (self.last_use(), self.transfer_use());
        self.ctx.pool_free(
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

/// Allocates memory for `requirements` in `location`; maps it when it is host-visible.
/// `export`: the buffer of a dedicated allocation exportable as an opaque fd.
fn allocate(
    ctx: &Core,
    requirements: vk::MemoryRequirements,
    requested: u64,
    location: MemoryLocation,
    export: Option<vk::Buffer>,
) -> Result<(vk::DeviceMemory, Option<Mapping>, Allocated)> {
    let props = ctx.memory_properties();
    let types = props.memory_types_as_slice();
    let heaps = props.memory_heaps_as_slice();
    // An export is for another API's kernels: VRAM proper, not its host-mapped window.
    let bar = location == MemoryLocation::DeviceLocal
        && export.is_none()
        && ctx.use_bar()
        && full_bar(types, heaps);
    let chosen = if bar {
        choose_bar_type(types, requirements.memory_type_bits)
    } else {
        None
    };
    let (type_index, flags) = chosen
        .or_else(|| choose_memory_type(types, requirements.memory_type_bits, location))
        .ok_or(Error::NoMemoryType {
            location: location.as_str(),
        })?;
    let max = ctx.caps().limits.max_memory_allocation_size;
    if max > 0 && requirements.size > max {
        return Err(Error::BufferTooLarge {
            requested,
            limit: max,
            limit_name: "maxMemoryAllocationSize",
        });
    }
    let heap_size = props
        .memory_heaps_as_slice()
        .get(types[type_index as usize].heap_index as usize)
        .map_or(u64::MAX, |h| h.size);
    if requirements.size > heap_size {
        // Drivers that overcommit (lavapipe) would fail later and less clearly.
        return Err(Error::OutOfMemory {
            kind: "device",
            requested,
            location: location.as_str(),
        });
    }

    let mut flags_info =
        vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
    let info = vk::MemoryAllocateInfo::default()
        .allocation_size(requirements.size)
        .memory_type_index(type_index)
        .push_next(&mut flags_info);
    let mut export_info = vk::ExportMemoryAllocateInfo::default()
        .handle_types(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
    let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default();
    let info = match export {
        Some(buffer) => {
            dedicated_info = dedicated_info.buffer(buffer);
            info.push_next(&mut export_info)
                .push_next(&mut dedicated_info)
        }
        None => info,
    };
    let device = ctx.device();
    // SAFETY: type index valid for the requirements; bufferDeviceAddress is enabled; an
    // export's chain is valid where the context enabled VK_KHR_external_memory_fd (checked
    // by the caller), and its dedicated buffer is unbound.
    let memory = unsafe { device.allocate_memory(&info, None) }
        .map_err(|r| oom_or(r, "vkAllocateMemory", requested, location))?;

    let mapped = if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
        // SAFETY: HOST_VISIBLE memory, not yet mapped.
        match unsafe { device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) } {
            Ok(ptr) => NonNull::new(ptr.cast::<u8>()).map(|ptr| Mapping {
                ptr,
                coherent: flags.contains(vk::MemoryPropertyFlags::HOST_COHERENT),
            }),
            Err(r) => {
                // SAFETY: memory not bound or in use.
                unsafe { device.free_memory(memory, None) };
                return Err(oom_or(r, "vkMapMemory", requested, location));
            }
        }
    } else {
        None
    };
    let allocated = Allocated {
        size: requirements.size,
        memory_type: type_index,
    };
    Ok((memory, mapped, allocated))
}

/// Whether all of the largest device-local heap is host-visible (resizable BAR, as on the
/// H200): then device-local buffers are mapped too, so small uploads and read-backs need no
/// staging copy. A small BAR window (256 MiB on older systems) does not count.
pub(crate) fn full_bar(types: &[vk::MemoryType], heaps: &[vk::MemoryHeap]) -> bool {
    use vk::MemoryPropertyFlags as F;
    let Some((largest, _)) = heaps
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)
    else {
        return false;
    };
    types.iter().any(|t| {
        t.heap_index as usize == largest
            && t.property_flags
                .contains(F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT)
    })
}

/// The device-local, host-visible, coherent type among `type_bits` (full BAR).
fn choose_bar_type(
    types: &[vk::MemoryType],
    type_bits: u32,
) -> Option<(u32, vk::MemoryPropertyFlags)> {
    use vk::MemoryPropertyFlags as F;
    let want = F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT;
    types.iter().enumerate().find_map(|(i, t)| {
        (type_bits & (1 << i) != 0 && t.property_flags.contains(want))
            .then_some((i as u32, t.property_flags))
    })
}

/// Picks the memory type for `location` among those allowed by `type_bits`.
///
/// DeviceLocal prefers types that are not host-visible (on discrete GPUs the host-visible
/// device-local heap is the small BAR window); HostVisible prefers coherent + cached
/// (fast read-back), then coherent system memory, then coherent BAR, then anything
/// host-visible.
pub fn choose_memory_type(
    types: &[vk::MemoryType],
    type_bits: u32,
    location: MemoryLocation,
) -> Option<(u32, vk::MemoryPropertyFlags)> {
    use vk::MemoryPropertyFlags as F;
    let allowed = |i: usize| type_bits & (1 << i) != 0;
    let find = |want: F, avoid: F| {
        types.iter().enumerate().find_map(|(i, t)| {
            let f = t.property_flags;
            (allowed(i) && f.contains(want) && !f.intersects(avoid)).then_some((i as u32, f))
        })
    };
    match location {
        MemoryLocation::DeviceLocal => find(F::DEVICE_LOCAL, F::HOST_VISIBLE)
            .or_else(|| find(F::DEVICE_LOCAL, F::empty()))
            .or_else(|| find(F::empty(), F::empty())),
        MemoryLocation::HostVisible => find(
            F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED,
            F::empty(),
        )
        .or_else(|| find(F::HOST_VISIBLE | F::HOST_COHERENT, F::DEVICE_LOCAL))
        .or_else(|| find(F::HOST_VISIBLE | F::HOST_COHERENT, F::empty()))
        .or_else(|| find(F::HOST_VISIBLE, F::empty())),
    }
}

fn oom_or(r: vk::Result, call: &'static str, requested: u64, location: MemoryLocation) -> Error {
    let kind = match r {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => "device",
        vk::Result::ERROR_OUT_OF_HOST_MEMORY => "host",
        _ => return Error::vk(call, r),
    };
    Error::OutOfMemory {
        kind,
        requested,
        location: location.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vk::MemoryPropertyFlags as F;

    fn t(flags: F) -> vk::MemoryType {
        vk::MemoryType {
            property_flags: flags,
            heap_index: 0,
        }
    }

    #[test]
    fn discrete_gpu_layout() {
        let types = [
            t(F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT), // BAR
            t(F::DEVICE_LOCAL),
            t(F::HOST_VISIBLE | F::HOST_COHERENT),
            t(F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED),
        ];
        let pick = |loc| choose_memory_type(&types, !0, loc).map(|(i, _)| i);
        assert_eq!(pick(MemoryLocation::DeviceLocal), Some(1));
        assert_eq!(pick(MemoryLocation::HostVisible), Some(3));
        // Respect the buffer's allowed types.
        assert_eq!(
            choose_memory_type(&types, 0b0101, MemoryLocation::HostVisible).map(|(i, _)| i),
            Some(2)
        );
        assert_eq!(
            choose_memory_type(&types, 0b0001, MemoryLocation::HostVisible),
            Some((0, types[0].property_flags))
        );
    }

    #[test]
    fn full_bar_only_when_the_big_heap_is_mapped() {
        let heap = |size, dl: bool| vk::MemoryHeap {
            size,
            flags: if dl {
                vk::MemoryHeapFlags::DEVICE_LOCAL
            } else {
                vk::MemoryHeapFlags::empty()
            },
        };
        let ty = |flags, heap_index| vk::MemoryType {
            property_flags: flags,
            heap_index,
        };
        let bar = F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT;
        // H200: the 140 GiB heap is reachable through a device-local host-visible type.
        let heaps = [heap(140 << 30, true), heap(94 << 30, false)];
        let types = [
            ty(F::DEVICE_LOCAL, 0),
            ty(F::HOST_VISIBLE | F::HOST_COHERENT, 1),
            ty(bar, 0),
        ];
        assert!(full_bar(&types, &heaps));
        assert_eq!(choose_bar_type(&types, !0).map(|(i, _)| i), Some(2));
        // A 256 MiB BAR window is a heap of its own, not the big one.
        let heaps = [
            heap(80 << 30, true),
            heap(256 << 20, true),
            heap(64 << 30, false),
        ];
        let types = [
            ty(F::DEVICE_LOCAL, 0),
            ty(bar, 1),
            ty(F::HOST_VISIBLE | F::HOST_COHERENT, 2),
        ];
        assert!(!full_bar(&types, &heaps));
    }

    #[test]
    fn unified_layout() {
        let all = F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT | F::HOST_CACHED;
        let types = [t(all)];
        assert_eq!(
            choose_memory_type(&types, 1, MemoryLocation::DeviceLocal),
            Some((0, all))
        );
        assert_eq!(
            choose_memory_type(&types, 1, MemoryLocation::HostVisible),
            Some((0, all))
        );
        assert_eq!(
            choose_memory_type(&types, 0, MemoryLocation::HostVisible),
            None
        );
    }
}
