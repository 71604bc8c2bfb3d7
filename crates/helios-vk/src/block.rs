//! Driver allocations: one VkDeviceMemory with one VkBuffer over all of it (a `Block`),
//! reachable by device address and mapped once for its whole life where host-visible, and
//! the choice of memory type for each `MemoryLocation`. Buffers are regions of blocks
//! (memory.rs), which the pool (pool.rs) carves and recycles.

use ash::vk;
use std::ptr::NonNull;

use crate::core::Core;
use crate::error::{Error, Result};

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

    /// A pointer to byte `at` of the mapping and whether the memory is host-coherent;
    /// `None` where the block is not mapped. The caller keeps `at` inside the block.
    pub(crate) fn map_ptr(&self, at: u64) -> Option<(*mut u8, bool)> {
        let map = self.mapped.as_ref()?;
        // SAFETY: `at` is inside the block, which is mapped whole.
        Some((unsafe { map.ptr.as_ptr().add(at as usize) }, map.coherent))
    }

    /// The whole mapping, for flushing or invalidating non-coherent memory.
    pub(crate) fn mapped_range(&self) -> vk::MappedMemoryRange<'static> {
        vk::MappedMemoryRange::default()
            .memory(self.memory)
            .offset(0)
            .size(vk::WHOLE_SIZE)
    }
}

/// What `allocate` got from the driver.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allocated {
    /// The VkDeviceMemory's size (the buffer's requirement, ≥ the size asked for).
    pub(crate) size: u64,
    pub(crate) memory_type: u32,
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
