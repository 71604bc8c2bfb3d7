// Buffers and the memory behind them.
//
// Every buffer is a storage buffer reachable by device address (kernels get addresses in
// push constants, never descriptors) and a transfer source/destination. All memory comes
// from `allocate`/`free`, the one seam where a pooled, caching allocator will replace the
// current one-vkAllocateMemory-per-buffer scheme. Host-visible buffers are mapped once for
// their whole life.

use ash::vk;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{vk_err, Error, Result};

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocation {
    /// Fastest for kernels; reached from the host through staging copies.
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
}

/// Smallest buffer actually created: size-0 buffers are legal for callers, not for Vulkan.
const MIN_ALLOCATION: u64 = 16;

pub struct Buffer {
    ctx: Arc<Context>,
    raw: vk::Buffer,
    allocation: Allocation,
    /// Size the caller asked for (may be 0); the VkBuffer may be larger.
    size: u64,
    address: u64,
    location: MemoryLocation,
}

impl Context {
    /// Creates a storage buffer of `size` bytes (0 allowed).
    pub fn create_buffer(self: &Arc<Self>, size: u64, location: MemoryLocation) -> Result<Buffer> {
        let alloc_size = size.max(1).next_multiple_of(MIN_ALLOCATION);
        let limits = &self.caps().limits;
        if let Some(max) = limits.max_buffer_size {
            if alloc_size > max {
                return Err(Error::BufferTooLarge {
                    requested: size,
                    limit: max,
                    limit_name: "maxBufferSize",
                });
            }
        }
        let device = self.device();
        let info = vk::BufferCreateInfo::default()
            .size(alloc_size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let raw = unsafe { device.create_buffer(&info, None) }
            .map_err(|r| oom_or(r, "vkCreateBuffer", size, location))?;
        // SAFETY: `raw` was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(raw) };
        let allocation = match allocate(self, requirements, size, location) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: unused buffer of this device.
                unsafe { device.destroy_buffer(raw, None) };
                return Err(e);
            }
        };
        // SAFETY: memory type was chosen from the buffer's requirements, offset is 0.
        if let Err(r) =
            unsafe { device.bind_buffer_memory(raw, allocation.memory, allocation.offset) }
        {
            // SAFETY: neither object is in use.
            unsafe {
                device.destroy_buffer(raw, None);
                free(self, &allocation);
            }
            return Err(oom_or(r, "vkBindBufferMemory", size, location));
        }
        let address_info = vk::BufferDeviceAddressInfo::default().buffer(raw);
        // SAFETY: bound buffer with SHADER_DEVICE_ADDRESS usage on a device with the feature.
        let address = unsafe { device.get_buffer_device_address(&address_info) };
        Ok(Buffer {
            ctx: Arc::clone(self),
            raw,
            allocation,
            size,
            address,
            location,
        })
    }
}

impl Buffer {
    /// Size in bytes as requested at creation.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// GPU address of byte 0, for push constants (`PhysicalStorageBuffer` pointers).
    pub fn device_address(&self) -> u64 {
        self.address
    }

    pub fn location(&self) -> MemoryLocation {
        self.location
    }

    /// True when the host reads and writes it directly (no staging copies).
    pub fn is_mapped(&self) -> bool {
        self.allocation.mapped.is_some()
    }

    pub fn raw(&self) -> vk::Buffer {
        self.raw
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

    /// Copies host bytes into the mapping. Caller checked the range and that it is mapped.
    #[track_caller]
    pub(crate) fn write_mapped(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        debug_assert!(offset + bytes.len() as u64 <= self.size, "unchecked range");
        let Some(map) = &self.allocation.mapped else {
            debug_assert!(false, "write_mapped on an unmapped buffer");
            return Ok(());
        };
        // SAFETY: range checked by the caller against `size` <= mapped length; the GPU is not
        // using the buffer (synchronous runtime: every submit is waited for).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                map.ptr.as_ptr().add(offset as usize),
                bytes.len(),
            )
        };
        if !map.coherent {
            let range = self.allocation.whole_range();
            // SAFETY: memory is mapped; whole-size range from offset 0 is always aligned.
            unsafe { self.ctx.device().flush_mapped_memory_ranges(&[range]) }
                .map_err(vk_err("vkFlushMappedMemoryRanges"))?;
        }
        Ok(())
    }

    /// Copies from the mapping into `out`. Caller checked the range and that it is mapped.
    #[track_caller]
    pub(crate) fn read_mapped(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        debug_assert!(offset + out.len() as u64 <= self.size, "unchecked range");
        let Some(map) = &self.allocation.mapped else {
            debug_assert!(false, "read_mapped on an unmapped buffer");
            return Ok(());
        };
        if !map.coherent {
            let range = self.allocation.whole_range();
            // SAFETY: as in write_mapped.
            unsafe { self.ctx.device().invalidate_mapped_memory_ranges(&[range]) }
                .map_err(vk_err("vkInvalidateMappedMemoryRanges"))?;
        }
        // SAFETY: as in write_mapped.
        unsafe {
            std::ptr::copy_nonoverlapping(
                map.ptr.as_ptr().add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: synchronous runtime: no submitted work still uses the buffer (with the
        // unsafe `submit`, keeping it alive is the caller's contract).
        unsafe {
            self.ctx.device().destroy_buffer(self.raw, None);
            free(&self.ctx, &self.allocation);
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("size", &self.size)
            .field("location", &self.location)
            .field("address", &format_args!("{:#x}", self.address))
            .finish()
    }
}

// ---- allocation seam ---------------------------------------------------------------------

pub(crate) struct Allocation {
    memory: vk::DeviceMemory,
    offset: u64,
    mapped: Option<Mapping>,
}

struct Mapping {
    ptr: NonNull<u8>,
    coherent: bool,
}

// SAFETY: the pointer is to device memory mapped for the allocation's whole life; access is
// bounded by range checks and ordered by the runtime's submit/wait.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Allocation {
    fn whole_range(&self) -> vk::MappedMemoryRange<'static> {
        vk::MappedMemoryRange::default()
            .memory(self.memory)
            .offset(0)
            .size(vk::WHOLE_SIZE)
    }
}

/// Allocates memory for `requirements` in `location` (`requested` is for error messages).
fn allocate(
    ctx: &Context,
    requirements: vk::MemoryRequirements,
    requested: u64,
    location: MemoryLocation,
) -> Result<Allocation> {
    let props = ctx.memory_properties();
    let types = props.memory_types_as_slice();
    let (type_index, flags) = choose_memory_type(types, requirements.memory_type_bits, location)
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
    let device = ctx.device();
    // SAFETY: type index valid for the requirements; bufferDeviceAddress is enabled.
    let memory = unsafe { device.allocate_memory(&info, None) }
        .map_err(|r| oom_or(r, "vkAllocateMemory", requested, location))?;

    let mapped = if location == MemoryLocation::HostVisible {
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
    Ok(Allocation {
        memory,
        offset: 0,
        mapped,
    })
}

/// Returns an allocation's memory (unmapping is implied by vkFreeMemory).
///
/// # Safety
/// No buffer bound to it may be in use by the device.
unsafe fn free(ctx: &Context, allocation: &Allocation) {
    ctx.device().free_memory(allocation.memory, None);
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
