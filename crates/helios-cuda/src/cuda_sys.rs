//! The CUDA driver API as Helios uses it: types, the parameter structs and the symbol table.
//!
//! Layouts and values follow `cuda.h` (CUDA 12/13); the tests below pin every struct's size and
//! the offsets the driver reads. Symbols are resolved by their ABI names: where `cuda.h`
//! `#define`s a name to a versioned one (`cuMemAlloc` → `cuMemAlloc_v2`), the versioned one is
//! what the library exports with today's signature, so that is the one we ask for.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use libloading::Library;

use crate::error::{Error, Result, LIBCUDA};
use crate::library::Loader;

pub(crate) type CuResult = c_int;
pub(crate) type CuDevice = c_int;
pub(crate) type CuContext = *mut c_void;
pub(crate) type CuStream = *mut c_void;
/// `CUdeviceptr` is `unsigned long long` on 64-bit hosts (since CUDA 3.2's `_v2` ABI).
pub(crate) type CuDevicePtr = u64;
pub(crate) type CuExternalMemory = *mut c_void;
pub(crate) type CuExternalSemaphore = *mut c_void;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
/// `CU_STREAM_DEFAULT`: a blocking stream, ordered after the legacy default stream.
pub(crate) const CU_STREAM_DEFAULT: c_uint = 0;
pub(crate) const CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_uint = 1;
pub(crate) const CUDA_EXTERNAL_MEMORY_DEDICATED: c_uint = 0x1;
pub(crate) const CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD: c_uint = 9;

/// `CUuuid`: `struct { char bytes[16]; }`.
#[repr(C)]
pub(crate) struct CuUuid {
    pub bytes: [u8; 16],
}

/// The `handle` union of the external memory and semaphore handle descriptors:
/// `{ int fd; struct { void *handle; const void *name; } win32; const void *nvSci...; }`.
/// `raw` stands for the two-pointer win32 member, which sets the size (16) and alignment (8).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union ExternalHandle {
    pub fd: c_int,
    pub raw: [u64; 2],
}

impl ExternalHandle {
    pub(crate) fn fd(fd: c_int) -> ExternalHandle {
        let mut handle = ExternalHandle { raw: [0; 2] };
        handle.fd = fd;
        handle
    }
}

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC` (104 bytes).
#[repr(C)]
pub(crate) struct ExternalMemoryHandleDesc {
    pub handle_type: c_uint,
    pub handle: ExternalHandle,
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC` (88 bytes).
#[repr(C)]
pub(crate) struct ExternalMemoryBufferDesc {
    pub offset: u64,
    pub size: u64,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC` (96 bytes).
#[repr(C)]
pub(crate) struct ExternalSemaphoreHandleDesc {
    pub handle_type: c_uint,
    pub handle: ExternalHandle,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS` (144 bytes). The C struct nests its members, and
/// so does this one: flattening them would drop the padding of the inner structs.
#[repr(C)]
pub(crate) struct ExternalSemaphoreSignalParams {
    pub params: SignalParamsInner,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// Its `params` member (72 bytes): `{ fence { u64 value }; union { void *fence; u64 reserved }
/// nvSciSync; keyedMutex { u64 key }; unsigned reserved[12] }`.
#[repr(C)]
pub(crate) struct SignalParamsInner {
    pub fence_value: u64,
    pub nv_sci_sync: u64,
    pub keyed_mutex_key: u64,
    pub reserved: [c_uint; 12],
}

/// `CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS` (144 bytes), nested as in C.
#[repr(C)]
pub(crate) struct ExternalSemaphoreWaitParams {
    pub params: WaitParamsInner,
    pub flags: c_uint,
    pub reserved: [c_uint; 16],
}

/// Its `params` member (72 bytes): `{ fence { u64 value }; union { void *fence; u64 reserved }
/// nvSciSync; keyedMutex { u64 key; unsigned timeoutMs }; unsigned reserved[10] }`.
#[repr(C)]
pub(crate) struct WaitParamsInner {
    pub fence_value: u64,
    pub nv_sci_sync: u64,
    pub keyed_mutex: KeyedMutexWait,
    pub reserved: [c_uint; 10],
}

/// The wait's `keyedMutex` member: 12 bytes of fields, padded to 16.
#[repr(C)]
pub(crate) struct KeyedMutexWait {
    pub key: u64,
    pub timeout_ms: c_uint,
}

impl ExternalSemaphoreSignalParams {
    /// Signal a timeline semaphore to `value`; every other member must be zero.
    pub(crate) fn timeline(value: u64) -> Self {
        ExternalSemaphoreSignalParams {
            params: SignalParamsInner {
                fence_value: value,
                nv_sci_sync: 0,
                keyed_mutex_key: 0,
                reserved: [0; 12],
            },
            flags: 0,
            reserved: [0; 16],
        }
    }
}

impl ExternalSemaphoreWaitParams {
    /// Wait for a timeline semaphore to reach `value`; every other member must be zero.
    pub(crate) fn timeline(value: u64) -> Self {
        ExternalSemaphoreWaitParams {
            params: WaitParamsInner {
                fence_value: value,
                nv_sci_sync: 0,
                keyed_mutex: KeyedMutexWait {
                    key: 0,
                    timeout_ms: 0,
                },
                reserved: [0; 10],
            },
            flags: 0,
            reserved: [0; 16],
        }
    }
}

/// The driver entry points Helios calls, resolved once from `libcuda`.
pub(crate) struct CudaApi {
    pub init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    pub device_get_uuid: unsafe extern "C" fn(*mut CuUuid, CuDevice) -> CuResult,
    pub device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    pub primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    pub primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    pub ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    pub stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    pub stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    pub stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    pub mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    pub mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    pub memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    pub memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    pub import_external_memory:
        unsafe extern "C" fn(*mut CuExternalMemory, *const ExternalMemoryHandleDesc) -> CuResult,
    pub external_memory_get_mapped_buffer: unsafe extern "C" fn(
        *mut CuDevicePtr,
        CuExternalMemory,
        *const ExternalMemoryBufferDesc,
    ) -> CuResult,
    pub destroy_external_memory: unsafe extern "C" fn(CuExternalMemory) -> CuResult,
    pub import_external_semaphore: unsafe extern "C" fn(
        *mut CuExternalSemaphore,
        *const ExternalSemaphoreHandleDesc,
    ) -> CuResult,
    pub signal_external_semaphores: unsafe extern "C" fn(
        *const CuExternalSemaphore,
        *const ExternalSemaphoreSignalParams,
        c_uint,
        CuStream,
    ) -> CuResult,
    pub wait_external_semaphores: unsafe extern "C" fn(
        *const CuExternalSemaphore,
        *const ExternalSemaphoreWaitParams,
        c_uint,
        CuStream,
    ) -> CuResult,
    pub destroy_external_semaphore: unsafe extern "C" fn(CuExternalSemaphore) -> CuResult,
    pub get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    pub get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Keeps the code behind the pointers above mapped.
    _lib: Library,
}

/// The names tried for the driver library, in order: the versioned soname the driver installs,
/// then the development symlink.
pub(crate) const LIBCUDA_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

impl CudaApi {
    pub(crate) fn load(names: &[&str]) -> Result<CudaApi> {
        let l = Loader::open(LIBCUDA, names)?;
        // SAFETY: each type below is the C declaration in cuda.h of the symbol it is resolved
        // from, with CUdevice = int, CUdeviceptr = unsigned long long and handles as pointers.
        unsafe {
            Ok(CudaApi {
                init: l.get(&["cuInit"])?,
                device_get_count: l.get(&["cuDeviceGetCount"])?,
                device_get: l.get(&["cuDeviceGet"])?,
                // _v2 (CUDA 11.4) reports a MIG instance's own UUID; the same for whole GPUs.
                device_get_uuid: l.get(&["cuDeviceGetUuid_v2", "cuDeviceGetUuid"])?,
                device_get_name: l.get(&["cuDeviceGetName"])?,
                primary_ctx_retain: l.get(&["cuDevicePrimaryCtxRetain"])?,
                primary_ctx_release: l.get(&["cuDevicePrimaryCtxRelease_v2"])?,
                ctx_set_current: l.get(&["cuCtxSetCurrent"])?,
                stream_create: l.get(&["cuStreamCreate"])?,
                stream_destroy: l.get(&["cuStreamDestroy_v2"])?,
                stream_synchronize: l.get(&["cuStreamSynchronize"])?,
                mem_alloc: l.get(&["cuMemAlloc_v2"])?,
                mem_free: l.get(&["cuMemFree_v2"])?,
                memcpy_htod: l.get(&["cuMemcpyHtoD_v2"])?,
                memcpy_dtoh: l.get(&["cuMemcpyDtoH_v2"])?,
                import_external_memory: l.get(&["cuImportExternalMemory"])?,
                external_memory_get_mapped_buffer: l.get(&["cuExternalMemoryGetMappedBuffer"])?,
                destroy_external_memory: l.get(&["cuDestroyExternalMemory"])?,
                import_external_semaphore: l.get(&["cuImportExternalSemaphore"])?,
                signal_external_semaphores: l.get(&["cuSignalExternalSemaphoresAsync"])?,
                wait_external_semaphores: l.get(&["cuWaitExternalSemaphoresAsync"])?,
                destroy_external_semaphore: l.get(&["cuDestroyExternalSemaphore"])?,
                get_error_name: l.get(&["cuGetErrorName"])?,
                get_error_string: l.get(&["cuGetErrorString"])?,
                _lib: l.into_library(),
            })
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`Error::Cuda`] with the driver's name and text for `code`.
    pub(crate) fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(Error::Cuda {
            call,
            code,
            name: self
                .describe(self.get_error_name, code)
                .unwrap_or_else(|| "an unknown CUDA error".to_string()),
            message: self
                .describe(self.get_error_string, code)
                .unwrap_or_else(|| "the driver has no description of this code".to_string()),
        })
    }

    fn describe(
        &self,
        f: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
        code: CuResult,
    ) -> Option<String> {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `f` is cuGetErrorName or cuGetErrorString, which store a pointer to a static
        // NUL-terminated string (or leave it NULL and fail for an unknown code).
        let ok = unsafe { f(code, &mut text) } == CUDA_SUCCESS;
        if !ok || text.is_null() {
            return None;
        }
        // SAFETY: non-null, and the driver's strings are static and NUL-terminated.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    // Sizes and offsets as cuda.h lays the structs out on x86-64 and aarch64 Linux.
    #[test]
    fn external_memory_descriptors_match_cuda_h() {
        assert_eq!(size_of::<ExternalHandle>(), 16);
        assert_eq!(align_of::<ExternalHandle>(), 8);
        assert_eq!(size_of::<ExternalMemoryHandleDesc>(), 104);
        assert_eq!(offset_of!(ExternalMemoryHandleDesc, handle), 8);
        assert_eq!(offset_of!(ExternalMemoryHandleDesc, size), 24);
        assert_eq!(offset_of!(ExternalMemoryHandleDesc, flags), 32);
        assert_eq!(offset_of!(ExternalMemoryHandleDesc, reserved), 36);

        assert_eq!(size_of::<ExternalMemoryBufferDesc>(), 88);
        assert_eq!(offset_of!(ExternalMemoryBufferDesc, size), 8);
        assert_eq!(offset_of!(ExternalMemoryBufferDesc, flags), 16);
    }

    #[test]
    fn external_semaphore_descriptors_match_cuda_h() {
        assert_eq!(size_of::<ExternalSemaphoreHandleDesc>(), 96);
        assert_eq!(offset_of!(ExternalSemaphoreHandleDesc, handle), 8);
        assert_eq!(offset_of!(ExternalSemaphoreHandleDesc, flags), 24);

        assert_eq!(size_of::<SignalParamsInner>(), 72);
        assert_eq!(offset_of!(SignalParamsInner, keyed_mutex_key), 16);
        assert_eq!(offset_of!(SignalParamsInner, reserved), 24);
        assert_eq!(size_of::<ExternalSemaphoreSignalParams>(), 144);
        assert_eq!(offset_of!(ExternalSemaphoreSignalParams, flags), 72);
        assert_eq!(offset_of!(ExternalSemaphoreSignalParams, reserved), 76);

        assert_eq!(size_of::<KeyedMutexWait>(), 16);
        assert_eq!(size_of::<WaitParamsInner>(), 72);
        assert_eq!(offset_of!(WaitParamsInner, keyed_mutex), 16);
        assert_eq!(offset_of!(WaitParamsInner, reserved), 32);
        assert_eq!(size_of::<ExternalSemaphoreWaitParams>(), 144);
        assert_eq!(offset_of!(ExternalSemaphoreWaitParams, flags), 72);
        assert_eq!(offset_of!(ExternalSemaphoreWaitParams, reserved), 76);
    }

    #[test]
    fn timeline_params_put_the_value_where_the_driver_reads_it() {
        // The driver reads `params.fence.value` at offset 0 and wants everything else zero.
        assert_eq!(offset_of!(ExternalSemaphoreSignalParams, params), 0);
        assert_eq!(offset_of!(SignalParamsInner, fence_value), 0);
        assert_eq!(offset_of!(ExternalSemaphoreWaitParams, params), 0);
        assert_eq!(offset_of!(WaitParamsInner, fence_value), 0);
        let signal = ExternalSemaphoreSignalParams::timeline(7);
        assert_eq!(signal.params.fence_value, 7);
        assert_eq!(signal.params.nv_sci_sync | signal.params.keyed_mutex_key, 0);
        assert!(signal
            .params
            .reserved
            .iter()
            .chain(&signal.reserved)
            .all(|&r| r == 0));
        assert_eq!(signal.flags, 0);
        let wait = ExternalSemaphoreWaitParams::timeline(9);
        assert_eq!(wait.params.fence_value, 9);
        assert_eq!(wait.params.keyed_mutex.key, 0);
        assert_eq!(wait.params.keyed_mutex.timeout_ms, 0);
        assert!(wait
            .params
            .reserved
            .iter()
            .chain(&wait.reserved)
            .all(|&r| r == 0));
        assert_eq!(wait.flags, 0);
    }

    #[test]
    fn an_fd_handle_sits_in_the_first_four_bytes_and_the_rest_is_zero() {
        let handle = ExternalHandle::fd(0x1234_5678);
        // SAFETY: `raw` covers all 16 bytes, all of which `fd()` initialised.
        let raw = unsafe { handle.raw };
        let bytes = [raw[0].to_ne_bytes(), raw[1].to_ne_bytes()].concat();
        assert_eq!(bytes[..4], 0x1234_5678i32.to_ne_bytes());
        assert!(bytes[4..].iter().all(|&b| b == 0));
    }

    #[test]
    fn cuuuid_is_sixteen_bytes() {
        assert_eq!(size_of::<CuUuid>(), 16);
    }
}
