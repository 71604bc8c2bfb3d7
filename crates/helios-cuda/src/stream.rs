//! Streams, and Vulkan timeline semaphores imported into CUDA to order them against Vulkan.
//!
//! The Vulkan side exports a timeline semaphore as an opaque fd; CUDA imports it, and a stream
//! can then wait for a value (Vulkan's backward pass is done) and signal one (the all-reduce is
//! done) on the GPU, with no host round trip.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use crate::cuda::Context;
use crate::cuda_sys::{
    CuExternalSemaphore, CuStream, ExternalHandle, ExternalSemaphoreHandleDesc,
    ExternalSemaphoreSignalParams, ExternalSemaphoreWaitParams,
    CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD, CU_STREAM_DEFAULT,
};
use crate::error::{Error, Result};

/// A CUDA stream. Work on it runs in order; calls here only enqueue, except `synchronize`.
///
/// It is a blocking stream (`CU_STREAM_DEFAULT`): it waits for work on the legacy default
/// stream, which is where the synchronous copies of [`crate::DeviceBuffer`] run, so a
/// collective queued after a copy sees the copied data.
pub struct Stream {
    ctx: Context,
    raw: CuStream,
}

// SAFETY: a CUstream is a driver handle usable from any thread once its context is current,
// which every method here ensures; the driver serialises submissions itself.
unsafe impl Send for Stream {}
// SAFETY: as above; methods take `&self` and only enqueue through the thread-safe driver.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Context) -> Result<Stream> {
        ctx.inner.make_current()?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: writes one CUstream; the flags are a valid CU_STREAM_* value.
        ctx.inner.check("cuStreamCreate", unsafe {
            (ctx.inner.api.stream_create)(&mut raw, CU_STREAM_DEFAULT)
        })?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// Blocks the calling thread until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.inner.make_current()?;
        // SAFETY: `raw` is a live stream of the current context.
        self.ctx.inner.check("cuStreamSynchronize", unsafe {
            (self.ctx.inner.api.stream_synchronize)(self.raw)
        })
    }

    /// Makes later work on this stream wait, on the GPU, until `sem` reaches `value`.
    /// Returns once the wait is queued.
    pub fn wait_external(&self, sem: &ExternalSemaphore, value: u64) -> Result<()> {
        self.check_same_context(&sem.ctx, "Stream::wait_external")?;
        self.ctx.inner.make_current()?;
        let params = ExternalSemaphoreWaitParams::timeline(value);
        // SAFETY: one semaphore and one params struct, both alive for the call (the driver
        // copies them); the semaphore and stream belong to the current context.
        self.ctx
            .inner
            .check("cuWaitExternalSemaphoresAsync", unsafe {
                (self.ctx.inner.api.wait_external_semaphores)(&sem.raw, &params, 1, self.raw)
            })
    }

    /// Signals `sem` to `value` once the work queued on this stream before it has finished.
    /// Returns once the signal is queued.
    pub fn signal_external(&self, sem: &ExternalSemaphore, value: u64) -> Result<()> {
        self.check_same_context(&sem.ctx, "Stream::signal_external")?;
        self.ctx.inner.make_current()?;
        let params = ExternalSemaphoreSignalParams::timeline(value);
        // SAFETY: as in `wait_external`.
        self.ctx
            .inner
            .check("cuSignalExternalSemaphoresAsync", unsafe {
                (self.ctx.inner.api.signal_external_semaphores)(&sem.raw, &params, 1, self.raw)
            })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The `CUstream` (also a `cudaStream_t`), for NCCL.
    pub(crate) fn raw(&self) -> CuStream {
        self.raw
    }

    pub(crate) fn check_same_context(&self, other: &Context, call: &'static str) -> Result<()> {
        if self.ctx.same_as(other) {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                call,
                detail: format!(
                    "the stream is on device {} but the other object is on device {}; \
                     use objects made from one device's context together",
                    self.ctx.device_ordinal(),
                    other.device_ordinal()
                ),
            })
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Nothing can be reported from drop; the driver lets queued work finish after destroy.
        if self.ctx.inner.make_current().is_ok() {
            // SAFETY: `raw` is a live stream of the current context, not used after this.
            let _ = unsafe { (self.ctx.inner.api.stream_destroy)(self.raw) };
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device_ordinal", &self.ctx.device_ordinal())
            .finish()
    }
}

/// A Vulkan timeline semaphore imported into CUDA.
pub struct ExternalSemaphore {
    ctx: Context,
    raw: CuExternalSemaphore,
}

// SAFETY: a CUexternalSemaphore is a driver handle usable from any thread once its context is
// current, which every use here ensures.
unsafe impl Send for ExternalSemaphore {}
// SAFETY: as above; it is never mutated after import.
unsafe impl Sync for ExternalSemaphore {}

impl ExternalSemaphore {
    /// Imports a timeline semaphore exported by Vulkan as an opaque fd
    /// (`VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT`).
    ///
    /// On success CUDA owns the fd; on failure it is closed here.
    pub fn import_timeline(ctx: &Context, fd: OwnedFd) -> Result<ExternalSemaphore> {
        ctx.inner.make_current()?;
        let desc = ExternalSemaphoreHandleDesc {
            handle_type: CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
            handle: ExternalHandle::fd(fd.as_raw_fd()),
            flags: 0,
            reserved: [0; 16],
        };
        let mut raw: CuExternalSemaphore = std::ptr::null_mut();
        // SAFETY: `desc` is a valid descriptor whose fd is open for the call; writes one handle.
        let code = unsafe { (ctx.inner.api.import_external_semaphore)(&mut raw, &desc) };
        ctx.inner.check("cuImportExternalSemaphore", code)?;
        // The driver took ownership of the fd: forget it without closing.
        let _ = fd.into_raw_fd();
        Ok(ExternalSemaphore {
            ctx: ctx.clone(),
            raw,
        })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for ExternalSemaphore {
    fn drop(&mut self) {
        if self.ctx.inner.make_current().is_ok() {
            // SAFETY: `raw` is a live import of the current context, not used after this.
            let _ = unsafe { (self.ctx.inner.api.destroy_external_semaphore)(self.raw) };
        }
    }
}
