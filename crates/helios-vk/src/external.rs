//! Sharing with another API on the same GPU (CUDA, for NCCL): memory exported as an opaque
//! fd, timeline semaphores exported the same way, and Helios's queues ordered against them.
//!
//! The decisions a reader must know:
//! - An exported allocation is one dedicated VkDeviceMemory with one VkBuffer over it, made
//!   outside the caching pool. Its `region`s are ordinary `Buffer`s, so every kernel and copy
//!   takes them, but regions may overlap (one region for the whole arena beside one per
//!   tensor), so their GPU accesses are tracked for the whole allocation: one set of marks,
//!   one key in the encoder's hazard tracking. That can only add barriers and waits, never
//!   miss one. The memory is freed once the `ExportedMemory` and every region are gone,
//!   after the GPU's last use of it (`ExportedBlock`, memory.rs); no region ever returns to
//!   the pool.
//! - External waits and signals ride on the encoder's batches, so they are ordered with
//!   everything else by submission order (encoder.rs): `signal_external` submits the open
//!   batch (or an empty one) with the signal attached, after a wait for every copy on the
//!   transfer queue; `wait_external` submits the open batch, so nothing recorded before the
//!   call waits, and the next batch on each queue waits (at all stages) for the value.
//!
//! The rule for host waits (`wait`, `synchronize`, read-backs): a host wait for GPU work
//! recorded after `wait_external(t, v)` blocks until `t` reaches `v`, as that work does. A
//! read-back that needs a copy on the GPU (any read of device memory on a discrete GPU)
//! records one after the call, so it blocks too, even for data written before. So `v` must
//! be signalled by someone who does not wait for this thread: a CUDA stream, another thread,
//! or this thread before it waits. Up to 16 batches may be in flight before a submit waits
//! for the oldest, so that bounds how much work may queue behind an unsignalled value.
//!
//! Under `HELIOS_VALIDATION=1`, the Khronos layer 1.3.239 (Debian's) tracks timelines only
//! through the signals it sees: a blocking host wait while another thread or API signals can
//! stall 10 s and report UNASSIGNED-VkSemaphore-state-timeout, a layer bug fixed upstream
//! in 2024; it does not happen without the layer.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ash::vk;

use crate::block::Block;
use crate::core::Core;
use crate::error::{vk_err, Error, Result};
use crate::memory::{Buffer, ExportedBlock};
use crate::owner::Owner;

/// Regions start at multiples of this (or of minStorageBufferOffsetAlignment, if larger):
/// what pool regions guarantee, enough for 16-byte vector access and for descriptors.
pub const REGION_ALIGN: u64 = 256;

/// Device-local memory exportable as an opaque POSIX fd: one dedicated allocation with one
/// buffer over it. Tensors live in `region`s of it; another API imports the whole allocation
/// (`fd`, `allocation_size`) and addresses them as base + offset.
pub struct ExportedMemory {
    shared: Arc<ExportedBlock>,
    /// Bytes asked for: regions must lie inside.
    size: u64,
}

impl ExportedMemory {
    /// A new fd for the allocation (`vkGetMemoryFdKHR`), owned by the caller: an importer
    /// such as `cuImportExternalMemory` takes it over on success; close it on failure.
    pub fn fd(&self) -> Result<OwnedFd> {
        let core = self.shared.context().core();
        let Some(ext) = &core.external_memory_fd else {
            return Err(export_unsupported(core, Shared::Memory));
        };
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.shared.block().memory())
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the memory was allocated exportable as an opaque fd on this device.
        let fd = unsafe { ext.get_memory_fd(&info) }.map_err(vk_err("vkGetMemoryFdKHR"))?;
        // SAFETY: the driver returned a new fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Bytes regions may cover (what `Context::export_memory` was asked for).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The VkDeviceMemory's size, which an importer must pass (CUDA's
    /// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC::size`); at least `size()`.
    pub fn allocation_size(&self) -> u64 {
        self.shared.allocated().size
    }

    /// Always true: the allocation is dedicated to its buffer
    /// (`CUDA_EXTERNAL_MEMORY_DEDICATED` on import).
    pub fn dedicated(&self) -> bool {
        true
    }

    /// The memory type index, which a Vulkan importer of an opaque fd must repeat.
    pub fn memory_type_index(&self) -> u32 {
        self.shared.allocated().memory_type
    }

    /// The VkBuffer over the whole allocation, and its size (`size()` rounded up to
    /// `REGION_ALIGN`). A Vulkan importer of the fd binds a buffer made like it: this size,
    /// `BUFFER_USAGE`, the sharing of `Context::queue_families`.
    pub fn raw_buffer(&self) -> (vk::Buffer, u64) {
        (self.shared.block().raw, self.shared.block().size)
    }

    /// GPU address of byte 0 (a region's is this plus its offset).
    pub fn device_address(&self) -> u64 {
        self.shared.block().address
    }

    /// The alignment `region` offsets need.
    pub fn alignment(&self) -> u64 {
        region_alignment(self.shared.context().core())
    }

    /// A `Buffer` over bytes `[offset, offset + size)`, used like any other (kernels,
    /// copies, transfers, hazard tracking). `offset` must be a multiple of `alignment()`.
    /// Regions may overlap; dropping one gives nothing back, the memory goes when the last
    /// region and this `ExportedMemory` are gone.
    pub fn region(&self, offset: u64, size: u64) -> Result<Buffer> {
        let align = self.alignment();
        if offset % align != 0 {
            return Err(Error::Misaligned {
                what: "exported memory region",
                offset,
                align,
            });
        }
        let block_size = self.shared.block().size;
        let inside = offset
            .checked_add(size)
            .is_some_and(|end| end <= self.size && offset < block_size);
        if !inside {
            return Err(Error::OutOfRange {
                what: "exported memory region",
                offset,
                len: size,
                size: self.size,
            });
        }
        // What a descriptor may bind: the size rounded up as pool regions are, never past the
        // buffer, nor into a region placed at the next aligned offset.
        let class = size
            .next_multiple_of(REGION_ALIGN)
            .max(REGION_ALIGN)
            .min(block_size - offset);
        Ok(Buffer::exported_region(&self.shared, offset, size, class))
    }
}

impl std::fmt::Debug for ExportedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedMemory")
            .field("size", &self.size)
            .field("allocation_size", &self.allocation_size())
            .field("address", &format_args!("{:#x}", self.device_address()))
            .finish()
    }
}

/// A timeline semaphore outside the Context's own, for ordering Helios's queues against
/// another signaller (CUDA, another thread, the host). Made by `Context::export_timeline`
/// (exportable as an opaque fd) or `Context::create_timeline` (host and Helios only).
pub struct ExternalTimeline {
    shared: Arc<Timeline>,
}

/// The semaphore; batches that wait for or signal it hold it until they complete.
pub(crate) struct Timeline {
    ctx: Arc<dyn Owner>,
    pub(crate) raw: vk::Semaphore,
    exportable: bool,
    /// The largest value signalled from this process (GPU or host): a later signal must be
    /// larger, or the queue would set the counter back.
    signalled: AtomicU64,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // SAFETY: every batch that used the semaphore held this and has completed.
        unsafe { self.ctx.core().device().destroy_semaphore(self.raw, None) };
    }
}

impl ExternalTimeline {
    /// A new opaque fd for the semaphore (`vkGetSemaphoreFdKHR`), owned by the caller (CUDA's
    /// `cuImportExternalSemaphore` with `CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD`
    /// takes it over on success).
    pub fn fd(&self) -> Result<OwnedFd> {
        let t = &self.shared;
        let core = t.ctx.core();
        let ext = match (&core.external_semaphore_fd, t.exportable) {
            (Some(ext), true) => ext,
            (None, _) => return Err(export_unsupported(core, Shared::Timeline)),
            (Some(_), false) => {
                return Err(Error::ExportUnsupported {
                    what: "this timeline semaphore",
                    device: core.caps().name.clone(),
                    reason: "it was made by create_timeline; make it with export_timeline".into(),
                })
            }
        };
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(t.raw)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the semaphore was created exportable as an opaque fd on this device.
        let fd = unsafe { ext.get_semaphore_fd(&info) }.map_err(vk_err("vkGetSemaphoreFdKHR"))?;
        // SAFETY: the driver returned a new fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Whether `fd` works (made by `export_timeline`).
    pub fn is_exportable(&self) -> bool {
        self.shared.exportable
    }

    /// The value the semaphore has reached (no waiting).
    pub fn value(&self) -> Result<u64> {
        self.shared.value()
    }

    /// Sets the semaphore to `value` from the host (`vkSignalSemaphore`): GPU work waiting
    /// for it (`Context::wait_external`) may run. `value` must exceed every value signalled
    /// so far.
    pub fn signal(&self, value: u64) -> Result<()> {
        let t = &self.shared;
        t.claim(value, "host signal")?;
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(t.raw)
            .value(value);
        // SAFETY: a timeline semaphore of this device; the value was checked to increase.
        unsafe { t.ctx.core().device().signal_semaphore(&info) }
            .map_err(vk_err("vkSignalSemaphore"))
    }

    /// Blocks until the semaphore reaches `value` or `timeout` passes; whether it did.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<bool> {
        let t = &self.shared;
        let semaphores = [t.raw];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: a timeline semaphore of this device; the timeout bounds the wait.
        match unsafe { t.ctx.core().device().wait_semaphores(&info, ns) } {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(r) => Err(Error::vk("vkWaitSemaphores", r)),
        }
    }

    /// The VkSemaphore, for APIs that take one (destroying it is the caller's bug).
    pub fn raw(&self) -> vk::Semaphore {
        self.shared.raw
    }
}

impl std::fmt::Debug for ExternalTimeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalTimeline")
            .field("exportable", &self.shared.exportable)
            .field("value", &self.shared.value().ok())
            .finish()
    }
}

impl Timeline {
    pub(crate) fn value(&self) -> Result<u64> {
        // SAFETY: a timeline semaphore of this device.
        unsafe {
            self.ctx
                .core()
                .device()
                .get_semaphore_counter_value(self.raw)
        }
        .map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Records `value` as signalled, if it exceeds every value signalled or reached so far.
    pub(crate) fn claim(&self, value: u64, what: &'static str) -> Result<()> {
        let current = self.value()?.max(self.signalled.load(Ordering::Acquire));
        if value <= current {
            return Err(Error::TimelineValue {
                what,
                value,
                current,
            });
        }
        self.signalled.fetch_max(value, Ordering::AcqRel);
        Ok(())
    }
}

/// What an export error is about.
#[derive(Clone, Copy)]
enum Shared {
    Memory,
    Timeline,
}

/// External timeline values a batch (or copy) waits for: at most one per semaphore, since a
/// timeline that reached a value has reached every smaller one.
#[derive(Default)]
pub(crate) struct ExternalWaits(Vec<(Arc<Timeline>, u64)>);

impl ExternalWaits {
    pub(crate) fn add(&mut self, timeline: &Arc<Timeline>, value: u64) {
        match self.0.iter_mut().find(|(t, _)| Arc::ptr_eq(t, timeline)) {
            Some((_, v)) => *v = (*v).max(value),
            None => self.0.push((Arc::clone(timeline), value)),
        }
    }

    /// Moves every wait out, leaving none.
    pub(crate) fn take(&mut self) -> ExternalWaits {
        ExternalWaits(std::mem::take(&mut self.0))
    }

    /// Puts back waits taken for a submission that failed.
    pub(crate) fn restore(&mut self, waits: ExternalWaits) {
        for (t, v) in &waits.0 {
            self.add(t, *v);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (vk::Semaphore, u64)> + '_ {
        self.0.iter().map(|(t, v)| (t.raw, *v))
    }
}

/// External signals attached to a batch: (semaphore, value), performed once everything
/// submitted before it on the queue has completed.
pub(crate) type ExternalSignals = Vec<(Arc<Timeline>, u64)>;

/// `Context::export_memory`, made on `ctx`; `empty_cache` gives memory cached by the pools
/// back to the driver.
pub(crate) fn export_memory(
    ctx: Arc<dyn Owner>,
    size: u64,
    empty_cache: impl FnOnce() -> Result<()>,
) -> Result<ExportedMemory> {
    let (core, pools) = (ctx.core(), ctx.pools());
    if !core.enabled().export_memory {
        return Err(export_unsupported(core, Shared::Memory));
    }
    // Regions round their ends up to REGION_ALIGN (what a descriptor binds), so the
    // buffer covers that; a VkBuffer may not be empty. (Past u64, the rounding stops
    // short and the allocation fails as too large.)
    let bytes =
        (size.saturating_add(REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN).max(REGION_ALIGN);
    if let Some(max) = core.caps().limits.max_buffer_size {
        if bytes > max {
            return Err(Error::BufferTooLarge {
                requested: size,
                limit: max,
                limit_name: "maxBufferSize",
            });
        }
    }
    let made = match Block::new_exported(core, pools.next_block_id(), bytes) {
        // Memory cached by the pool may be what is missing: give it back, try once more.
        Err(Error::OutOfMemory { .. }) => {
            empty_cache()?;
            Block::new_exported(core, pools.next_block_id(), bytes)
        }
        made => made,
    };
    let (block, allocated) = made?;
    pools
        .exported_bytes
        .fetch_add(allocated.size, Ordering::Relaxed);
    Ok(ExportedMemory {
        shared: Arc::new(ExportedBlock::new(ctx, block, allocated)),
        size,
    })
}

/// The alignment of exported regions: `REGION_ALIGN` or the device's
/// minStorageBufferOffsetAlignment, whichever is larger.
pub(crate) fn region_alignment(core: &Core) -> u64 {
    REGION_ALIGN.max(core.caps().limits.min_storage_buffer_offset_alignment)
}

/// `Context::export_timeline`, made on `ctx`.
pub(crate) fn export_timeline(ctx: Arc<dyn Owner>) -> Result<ExternalTimeline> {
    if !ctx.core().enabled().export_timeline {
        return Err(export_unsupported(ctx.core(), Shared::Timeline));
    }
    new_timeline(ctx, true)
}

/// `Context::import_timeline`, made on `ctx`.
pub(crate) fn import_timeline(ctx: Arc<dyn Owner>, fd: OwnedFd) -> Result<ExternalTimeline> {
    let Some(ext) = &ctx.core().external_semaphore_fd else {
        return Err(export_unsupported(ctx.core(), Shared::Timeline));
    };
    let t = new_timeline(Arc::clone(&ctx), false)?;
    let info = vk::ImportSemaphoreFdInfoKHR::default()
        .semaphore(t.shared.raw)
        .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
        .fd(fd.as_raw_fd());
    // SAFETY: a timeline semaphore of this device not yet used; on success the driver
    // owns the fd, so it is forgotten here (closed by the OwnedFd only on failure).
    unsafe { ext.import_semaphore_fd(&info) }.map_err(vk_err("vkImportSemaphoreFdKHR"))?;
    std::mem::forget(fd);
    Ok(t)
}

/// A timeline semaphore made on `ctx` (`Context::create_timeline` where not `export`).
pub(crate) fn new_timeline(ctx: Arc<dyn Owner>, export: bool) -> Result<ExternalTimeline> {
    let mut type_info = vk::SemaphoreTypeCreateInfo::default()
        .semaphore_type(vk::SemaphoreType::TIMELINE)
        .initial_value(0);
    let mut export_info = vk::ExportSemaphoreCreateInfo::default()
        .handle_types(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
    let info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
    let info = match export {
        true => info.push_next(&mut export_info),
        false => info,
    };
    // SAFETY: valid device; timeline semaphores are enabled, and the export struct is
    // chained only where VK_KHR_external_semaphore_fd is (checked by the caller).
    let raw = unsafe { ctx.core().device().create_semaphore(&info, None) }
        .map_err(vk_err("vkCreateSemaphore(external timeline)"))?;
    ctx.core().set_name(raw, "helios external timeline");
    Ok(ExternalTimeline {
        shared: Arc::new(Timeline {
            ctx,
            raw,
            exportable: export,
            signalled: AtomicU64::new(0),
        }),
    })
}

/// The semaphore of `timeline`, made on the Context whose core is `core`.
pub(crate) fn own_timeline<'t>(
    core: &Core,
    timeline: &'t ExternalTimeline,
) -> Result<&'t Arc<Timeline>> {
    let t = &timeline.shared;
    if std::ptr::eq(t.ctx.core(), core) {
        Ok(t)
    } else {
        Err(Error::ForeignObject {
            what: "the external timeline",
        })
    }
}

/// Why `what` cannot be exported here.
fn export_unsupported(core: &Core, what: Shared) -> Error {
    let x = &core.caps().external;
    let (listed, support, ext, what) = match what {
        Shared::Memory => (x.memory_fd, x.memory, "VK_KHR_external_memory_fd", "memory"),
        Shared::Timeline => (
            x.semaphore_fd,
            x.timeline,
            "VK_KHR_external_semaphore_fd",
            "a timeline semaphore",
        ),
    };
    let reason = if !listed {
        format!("its driver does not offer {ext}")
    } else if !support.exportable {
        format!("its driver offers {ext} but cannot export {what} of the kind Helios uses as an opaque fd")
    } else {
        format!("{ext} is not enabled on this context")
    };
    Error::ExportUnsupported {
        what,
        device: core.caps().name.clone(),
        reason,
    }
}
