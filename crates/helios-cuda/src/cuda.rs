//! The driver, its devices, and a device's primary context.
//!
//! Helios uses each device's *primary* context, the one the CUDA runtime (and so NCCL) uses
//! too: a communicator and the buffers handed to it then live in one context.

use std::ffi::c_char;
use std::sync::Arc;

use crate::cuda_sys::{CuContext, CuDevice, CuUuid, CudaApi, LIBCUDA_NAMES};
use crate::error::{format_uuid, Error, Result};

/// The loaded CUDA driver. Cheap to clone.
#[derive(Clone)]
pub struct Cuda {
    api: Arc<CudaApi>,
}

impl Cuda {
    /// Opens `libcuda.so.1` (then `libcuda.so`), resolves the driver calls Helios needs and
    /// initialises the driver (`cuInit(0)`).
    pub fn load() -> Result<Cuda> {
        Self::load_from_names(LIBCUDA_NAMES)
    }

    pub(crate) fn load_from_names(names: &[&str]) -> Result<Cuda> {
        let api = CudaApi::load(names)?;
        // SAFETY: cuInit takes flags, which must be 0.
        api.check("cuInit", unsafe { (api.init)(0) })?;
        Ok(Cuda { api: Arc::new(api) })
    }

    /// How many devices CUDA sees (after `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> Result<usize> {
        let mut count = 0;
        // SAFETY: writes one int.
        self.api.check("cuDeviceGetCount", unsafe {
            (self.api.device_get_count)(&mut count)
        })?;
        Ok(count.max(0) as usize)
    }

    /// The device of CUDA ordinal `ordinal`.
    pub fn device(&self, ordinal: usize) -> Result<CudaDevice> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument {
                call: "Cuda::device",
                detail: format!(
                    "device {ordinal} does not exist: CUDA sees {count} device(s); \
                     use an ordinal below that or check CUDA_VISIBLE_DEVICES"
                ),
            });
        }
        let mut handle: CuDevice = 0;
        // SAFETY: writes one CUdevice; the ordinal is in range.
        self.api.check("cuDeviceGet", unsafe {
            (self.api.device_get)(&mut handle, ordinal as i32)
        })?;
        let mut uuid = CuUuid { bytes: [0; 16] };
        // SAFETY: writes one CUuuid.
        self.api.check("cuDeviceGetUuid", unsafe {
            (self.api.device_get_uuid)(&mut uuid, handle)
        })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: writes at most `len` bytes, NUL-terminated.
        self.api.check("cuDeviceGetName", unsafe {
            (self.api.device_get_name)(name.as_mut_ptr(), name.len() as i32, handle)
        })?;
        let name: Vec<u8> = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(CudaDevice {
            api: self.api.clone(),
            handle,
            ordinal,
            uuid: uuid.bytes,
            name: String::from_utf8_lossy(&name).into_owned(),
        })
    }

    /// Every device CUDA sees, in ordinal order.
    pub fn devices(&self) -> Result<Vec<CudaDevice>> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }

    /// The device whose UUID is `uuid`: pass a Vulkan device's
    /// `VkPhysicalDeviceIDProperties::deviceUUID` to find the same GPU in CUDA.
    pub fn device_by_uuid(&self, uuid: &[u8; 16]) -> Result<CudaDevice> {
        let devices = self.devices()?;
        let seen = devices
            .iter()
            .map(|d| format!("{}: {} {}", d.ordinal, d.name, format_uuid(&d.uuid)))
            .collect();
        devices
            .into_iter()
            .find(|d| &d.uuid == uuid)
            .ok_or_else(|| Error::NoDevice {
                uuid: format_uuid(uuid),
                seen,
            })
    }
}

/// One CUDA device.
#[derive(Clone)]
pub struct CudaDevice {
    api: Arc<CudaApi>,
    handle: CuDevice,
    ordinal: usize,
    uuid: [u8; 16],
    name: String,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("uuid", &format_uuid(&self.uuid))
            .finish()
    }
}

impl CudaDevice {
    /// The CUDA ordinal (which `CUDA_VISIBLE_DEVICES` renumbers).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The UUID, equal to Vulkan's `deviceUUID` for the same GPU.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Retains the device's primary context and makes it current on the calling thread.
    pub fn primary_context(&self) -> Result<Context> {
        let mut raw: CuContext = std::ptr::null_mut();
        // SAFETY: writes one CUcontext.
        self.api.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.api.primary_ctx_retain)(&mut raw, self.handle)
        })?;
        let ctx = Context {
            inner: Arc::new(ContextInner {
                api: self.api.clone(),
                raw,
                device: self.handle,
                ordinal: self.ordinal,
            }),
        };
        ctx.make_current()?;
        Ok(ctx)
    }
}

/// A retained primary context. Cheap to clone; released when the last clone and the last
/// object made in it (streams, buffers, imports, communicators) are gone.
///
/// Thread rule: CUDA's current context is per thread. Every call of this crate that needs a
/// context first makes it current on the calling thread (a cheap thread-local store), so the
/// objects here may be used from any thread; the context stays current there afterwards.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) api: Arc<CudaApi>,
    pub(crate) raw: CuContext,
    device: CuDevice,
    ordinal: usize,
}

// SAFETY: a CUcontext is a handle the driver lets any thread make current and use; the driver
// API is thread-safe.
unsafe impl Send for ContextInner {}
// SAFETY: as above; nothing here is mutated after creation.
unsafe impl Sync for ContextInner {}

impl ContextInner {
    pub(crate) fn make_current(&self) -> Result<()> {
        // SAFETY: `raw` is a retained context, alive while `self` is.
        self.api.check("cuCtxSetCurrent", unsafe {
            (self.api.ctx_set_current)(self.raw)
        })
    }

    pub(crate) fn check(&self, call: &'static str, code: i32) -> Result<()> {
        self.api.check(call, code)
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `primary_context`. Nothing can be reported from drop;
        // a failure here means the driver is already shutting down.
        let _ = unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

impl Context {
    /// Makes this context current on the calling thread. Calls of this crate do it
    /// themselves; call it before using the CUDA runtime (or a library on it) directly.
    pub fn make_current(&self) -> Result<()> {
        self.inner.make_current()
    }

    /// The CUDA ordinal of the context's device.
    pub fn device_ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// Whether `other` is the same CUDA context (two `Context`s retained from one device are).
    pub fn same_as(&self, other: &Context) -> bool {
        self.inner.raw == other.inner.raw
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device_ordinal", &self.inner.ordinal)
            .finish()
    }
}
