//! Device addresses: memory CUDA allocates, and Vulkan memory imported into CUDA.
//!
//! Vulkan exports one allocation (the gradient arena) as an opaque fd; CUDA imports it and maps
//! it once as a buffer, and tensors inside are that base plus their offset ([`DevicePtr::offset`]).

use std::ffi::c_void;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

use crate::cuda::Context;
use crate::cuda_sys::{
    CuDevicePtr, CuExternalMemory, ExternalHandle, ExternalMemoryBufferDesc,
    ExternalMemoryHandleDesc, CUDA_EXTERNAL_MEMORY_DEDICATED,
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
};
use crate::error::{Error, Result};

/// A device address in some context (`CUdeviceptr`). A plain value: whoever hands one to a
/// collective promises that memory behind it is alive (see the `# Safety` of [`crate::Comm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// Wraps an address obtained elsewhere (another CUDA library, a mapped buffer).
    pub fn from_raw(address: u64) -> DevicePtr {
        DevicePtr(address)
    }

    pub fn raw(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on; `None` if that overflows.
    pub fn offset(self, bytes: u64) -> Option<DevicePtr> {
        self.0.checked_add(bytes).map(DevicePtr)
    }

    pub(crate) fn as_ptr(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

/// Device memory from `cuMemAlloc`, freed on drop. Meant for tests and staging.
pub struct DeviceBuffer {
    ctx: Context,
    ptr: CuDevicePtr,
    /// Size in bytes.
    len: usize,
}

// SAFETY: a device allocation may be used from any thread once its context is current, which
// every method here ensures; writes go through `&mut self`.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; `&self` methods only read.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `bytes` bytes (uninitialised) on the context's device.
    pub fn alloc(ctx: &Context, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(Error::InvalidArgument {
                call: "DeviceBuffer::alloc",
                detail: "CUDA cannot allocate 0 bytes; ask for at least one".to_string(),
            });
        }
        ctx.inner.make_current()?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: writes one CUdeviceptr.
        ctx.inner.check("cuMemAlloc", unsafe {
            (ctx.inner.api.mem_alloc)(&mut ptr, bytes)
        })?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            len: bytes,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Copies `src` to the start of the buffer. Synchronous, on the legacy default stream: it
    /// waits for earlier work on blocking streams, and returns once `src` may be reused.
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<()> {
        self.check_len("DeviceBuffer::copy_from_host", src.len())?;
        self.ctx.inner.make_current()?;
        // SAFETY: `src` is readable for its length, which fits in the allocation.
        self.ctx.inner.check("cuMemcpyHtoD", unsafe {
            (self.ctx.inner.api.memcpy_htod)(self.ptr, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies the start of the buffer into `dst`. Synchronous: it waits for earlier work on
    /// blocking streams (every [`crate::Stream`] is one), and returns once `dst` is filled.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        self.check_len("DeviceBuffer::copy_to_host", dst.len())?;
        self.ctx.inner.make_current()?;
        // SAFETY: `dst` is writable for its length, which fits in the allocation.
        self.ctx.inner.check("cuMemcpyDtoH", unsafe {
            (self.ctx.inner.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), self.ptr, dst.len())
        })
    }

    fn check_len(&self, call: &'static str, host_len: usize) -> Result<()> {
        if host_len <= self.len {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                call,
                detail: format!(
                    "the host slice has {host_len} bytes but the device buffer only {}; \
                     copy at most the buffer's length",
                    self.len
                ),
            })
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.inner.make_current().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once.
            let _ = unsafe { (self.ctx.inner.api.mem_free)(self.ptr) };
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

/// A Vulkan memory allocation imported into CUDA. Buffers mapped from it stay valid until it
/// is dropped, which unmaps (frees) them and then destroys the import.
pub struct ExternalMemory {
    ctx: Context,
    raw: CuExternalMemory,
    /// The size of the whole Vulkan allocation, in bytes.
    size: u64,
    /// Every address `mapped_buffer` returned: CUDA wants each freed before the destroy.
    mapped: Mutex<Vec<CuDevicePtr>>,
}

// SAFETY: a CUexternalMemory is a driver handle usable from any thread once its context is
// current, which every use here ensures; the list of mappings is behind a mutex.
unsafe impl Send for ExternalMemory {}
// SAFETY: as above.
unsafe impl Sync for ExternalMemory {}

impl ExternalMemory {
    /// Imports a Vulkan allocation exported as an opaque fd
    /// (`VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT`). `allocation_size` is the size of the
    /// whole `VkDeviceMemory` (`VkMemoryAllocateInfo::allocationSize`), and `dedicated` whether
    /// it was a dedicated allocation (`VkMemoryDedicatedAllocateInfo`), which CUDA must be told.
    ///
    /// On success CUDA owns the fd; on failure it is closed here.
    pub fn import(
        ctx: &Context,
        fd: OwnedFd,
        allocation_size: u64,
        dedicated: bool,
    ) -> Result<ExternalMemory> {
        if allocation_size == 0 {
            return Err(Error::InvalidArgument {
                call: "ExternalMemory::import",
                detail: "allocation_size is 0; pass the size of the whole Vulkan allocation"
                    .to_string(),
            });
        }
        ctx.inner.make_current()?;
        let desc = ExternalMemoryHandleDesc {
            handle_type: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            handle: ExternalHandle::fd(fd.as_raw_fd()),
            size: allocation_size,
            flags: if dedicated {
                CUDA_EXTERNAL_MEMORY_DEDICATED
            } else {
                0
            },
            reserved: [0; 16],
        };
        let mut raw: CuExternalMemory = std::ptr::null_mut();
        // SAFETY: `desc` is a valid descriptor whose fd is open for the call; writes one handle.
        let code = unsafe { (ctx.inner.api.import_external_memory)(&mut raw, &desc) };
        ctx.inner.check("cuImportExternalMemory", code)?;
        // The driver took ownership of the fd: forget it without closing.
        let _ = fd.into_raw_fd();
        Ok(ExternalMemory {
            ctx: ctx.clone(),
            raw,
            size: allocation_size,
            mapped: Mutex::new(Vec::new()),
        })
    }

    /// The size of the imported allocation, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Maps bytes `offset .. offset + size` of the allocation as a device buffer, valid until
    /// `self` is dropped. Map the whole range once and address tensors as base + offset.
    pub fn mapped_buffer(&self, offset: u64, size: u64) -> Result<DevicePtr> {
        let end = offset.checked_add(size);
        if size == 0 || end.map_or(true, |end| end > self.size) {
            return Err(Error::InvalidArgument {
                call: "ExternalMemory::mapped_buffer",
                detail: format!(
                    "range {offset} + {size} bytes is empty or outside the imported \
                     allocation of {} bytes; map a non-empty range inside it",
                    self.size
                ),
            });
        }
        self.ctx.inner.make_current()?;
        let desc = ExternalMemoryBufferDesc {
            offset,
            size,
            flags: 0,
            reserved: [0; 16],
        };
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: `raw` is a live import of the current context; writes one CUdeviceptr.
        self.ctx
            .inner
            .check("cuExternalMemoryGetMappedBuffer", unsafe {
                (self.ctx.inner.api.external_memory_get_mapped_buffer)(&mut ptr, self.raw, &desc)
            })?;
        self.mapped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(ptr);
        Ok(DevicePtr(ptr))
    }
}

impl Drop for ExternalMemory {
    fn drop(&mut self) {
        if self.ctx.inner.make_current().is_err() {
            return;
        }
        let api = &self.ctx.inner.api;
        let mapped = self
            .mapped
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for &ptr in mapped.iter() {
            // SAFETY: each came from cuExternalMemoryGetMappedBuffer on `raw` and is freed once,
            // as CUDA requires before the import is destroyed.
            let _ = unsafe { (api.mem_free)(ptr) };
        }
        // SAFETY: `raw` is a live import of the current context, not used after this.
        let _ = unsafe { (api.destroy_external_memory)(self.raw) };
    }
}

impl std::fmt::Debug for ExternalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMemory")
            .field("size", &self.size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pointer_offsets_refuse_to_overflow() {
        let p = DevicePtr::from_raw(u64::MAX - 4);
        assert_eq!(p.offset(4), Some(DevicePtr::from_raw(u64::MAX)));
        assert_eq!(p.offset(5), None);
    }
}
