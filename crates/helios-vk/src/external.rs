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
//!   after the GPU's last use of it; no region ever returns to the pool.
//! - External waits and signals ride on the encoder's batches, so they are ordered with
//!   everything else by submission order: `signal_external` submits the open batch (or an
//!   empty one) with the signal attached, after a wait for every copy on the transfer queue;
//!   `wait_external` submits the open batch, so nothing recorded before the call waits, and
//!   the next batch on each queue waits (at all stages) for the value.
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

use crate::block::{Allocated, Block};
use crate::context::Context;
use crate::error::{vk_err, Error, Result};
use crate::memory::{Buffer, Marks};

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

/// The allocation behind an `ExportedMemory` and its regions (each holds it).
pub(crate) struct ExportedBlock {
    ctx: Arc<Context>,
    block: Arc<Block>,
    /// GPU accesses through any region.
    marks: Marks,
    allocated: Allocated,
}

impl ExportedBlock {
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn block(&self) -> &Arc<Block> {
        &self.block
    }

    pub(crate) fn marks(&self) -> &Marks {
        &self.marks
    }
}

impl Drop for ExportedBlock {
    fn drop(&mut self) {
        let ctx = &self.ctx;
        ctx.pools
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
            Ok(()) => unsafe { self.block.destroy(ctx.device()) },
            // A drop inside a recording closure, or a lost device: freed with the Context,
            // after it waited for the device to go idle.
            Err(_) => ctx.pools.defer_destroy(Arc::clone(&self.block)),
        }
    }
}

impl ExportedMemory {
    /// A new fd for the allocation (`vkGetMemoryFdKHR`), owned by the caller: an importer
    /// such as `cuImportExternalMemory` takes it over on success; close it on failure.
    pub fn fd(&self) -> Result<OwnedFd> {
        let ctx = &self.shared.ctx;
        let Some(ext) = &ctx.core.external_memory_fd else {
            return Err(ctx.export_unsupported(Shared::Memory));
        };
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.shared.block.memory())
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
        self.shared.allocated.size
    }

    /// Always true: the allocation is dedicated to its buffer
    /// (`CUDA_EXTERNAL_MEMORY_DEDICATED` on import).
    pub fn dedicated(&self) -> bool {
        true
    }

    /// The memory type index, which a Vulkan importer of an opaque fd must repeat.
    pub fn memory_type_index(&self) -> u32 {
        self.shared.allocated.memory_type
    }

    /// The VkBuffer over the whole allocation, and its size (`size()` rounded up to
    /// `REGION_ALIGN`). A Vulkan importer of the fd binds a buffer made like it: this size,
    /// `BUFFER_USAGE`, the sharing of `Context::queue_families`.
    pub fn raw_buffer(&self) -> (vk::Buffer, u64) {
        (self.shared.block.raw, self.shared.block.size)
    }

    /// GPU address of byte 0 (a region's is this plus its offset).
    pub fn device_address(&self) -> u64 {
        self.shared.block.address
    }

    /// The alignment `region` offsets need.
    pub fn alignment(&self) -> u64 {
        self.shared.ctx.region_alignment()
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
        let block_size = self.shared.block.size;
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
    ctx: Arc<Context>,
    pub(crate) raw: vk::Semaphore,
    exportable: bool,
    /// The largest value signalled from this process (GPU or host): a later signal must be
    /// larger, or the queue would set the counter back.
    signalled: AtomicU64,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // SAFETY: every batch that used the semaphore held this and has completed.
        unsafe { self.ctx.device().destroy_semaphore(self.raw, None) };
    }
}

impl ExternalTimeline {
    /// A new opaque fd for the semaphore (`vkGetSemaphoreFdKHR`), owned by the caller (CUDA's
    /// `cuImportExternalSemaphore` with `CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD`
    /// takes it over on success).
    pub fn fd(&self) -> Result<OwnedFd> {
        let t = &self.shared;
        let ext = match (&t.ctx.core.external_semaphore_fd, t.exportable) {
            (Some(ext), true) => ext,
            (None, _) => return Err(t.ctx.export_unsupported(Shared::Timeline)),
            (Some(_), false) => {
                return Err(Error::ExportUnsupported {
                    what: "this timeline semaphore",
                    device: t.ctx.caps().name.clone(),
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
        unsafe { t.ctx.device().signal_semaphore(&info) }.map_err(vk_err("vkSignalSemaphore"))
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
        match unsafe { t.ctx.device().wait_semaphores(&info, ns) } {
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
    fn value(&self) -> Result<u64> {
        // SAFETY: a timeline semaphore of this device.
        unsafe { self.ctx.device().get_semaphore_counter_value(self.raw) }
            .map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Records `value` as signalled, if it exceeds every value signalled or reached so far.
    fn claim(&self, value: u64, what: &'static str) -> Result<()> {
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

impl Context {
    /// An allocation of `size` bytes exportable as an opaque fd: dedicated, device-local,
    /// with one buffer of the usage every Helios buffer has (storage, transfers, device
    /// address). Errors where the driver cannot export (see `EnabledFeatures::export_memory`).
    pub fn export_memory(self: &Arc<Self>, size: u64) -> Result<ExportedMemory> {
        if !self.enabled().export_memory {
            return Err(self.export_unsupported(Shared::Memory));
        }
        // Regions round their ends up to REGION_ALIGN (what a descriptor binds), so the
        // buffer covers that; a VkBuffer may not be empty. (Past u64, the rounding stops
        // short and the allocation fails as too large.)
        let bytes =
            (size.saturating_add(REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN).max(REGION_ALIGN);
        if let Some(max) = self.caps().limits.max_buffer_size {
            if bytes > max {
                return Err(Error::BufferTooLarge {
                    requested: size,
                    limit: max,
                    limit_name: "maxBufferSize",
                });
            }
        }
        let made = match Block::new_exported(&self.core, self.pools.next_block_id(), bytes) {
            // Memory cached by the pool may be what is missing: give it back, try once more.
            Err(Error::OutOfMemory { .. }) => {
                self.empty_cache()?;
                Block::new_exported(&self.core, self.pools.next_block_id(), bytes)
            }
            made => made,
        };
        let (block, allocated) = made?;
        self.pools
            .exported_bytes
            .fetch_add(allocated.size, Ordering::Relaxed);
        Ok(ExportedMemory {
            shared: Arc::new(ExportedBlock {
                ctx: Arc::clone(self),
                block: Arc::new(block),
                marks: Marks::default(),
                allocated,
            }),
            size,
        })
    }

    /// The alignment of exported regions: `REGION_ALIGN` or the device's
    /// minStorageBufferOffsetAlignment, whichever is larger.
    pub fn region_alignment(&self) -> u64 {
        REGION_ALIGN.max(self.caps().limits.min_storage_buffer_offset_alignment)
    }

    /// A timeline semaphore (initial value 0) exportable as an opaque fd, for another API to
    /// import (`ExternalTimeline::fd`). Errors where the driver cannot export one (see
    /// `EnabledFeatures::export_timeline`).
    pub fn export_timeline(&self) -> Result<ExternalTimeline> {
        if !self.enabled().export_timeline {
            return Err(self.export_unsupported(Shared::Timeline));
        }
        self.new_timeline(true)
    }

    /// A timeline semaphore (initial value 0) that is not exportable, on any device: for
    /// ordering Helios's work against the host or another thread (`ExternalTimeline::signal`)
    /// with the same calls as an exported one.
    pub fn create_timeline(&self) -> Result<ExternalTimeline> {
        self.new_timeline(false)
    }

    /// A timeline semaphore whose payload is the one behind `fd` (an opaque fd from
    /// `ExternalTimeline::fd` of another device or process, or from CUDA): waits and signals
    /// here order against the other side's. The fd is consumed, also on failure.
    pub fn import_timeline(&self, fd: OwnedFd) -> Result<ExternalTimeline> {
        let Some(ext) = &self.core.external_semaphore_fd else {
            return Err(self.export_unsupported(Shared::Timeline));
        };
        let t = self.new_timeline(false)?;
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

    fn new_timeline(&self, export: bool) -> Result<ExternalTimeline> {
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
        let raw = unsafe { self.device().create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore(external timeline)"))?;
        self.core.set_name(raw, "helios external timeline");
        let ctx = self.me.upgrade().expect("a Context in use has a handle");
        Ok(ExternalTimeline {
            shared: Arc::new(Timeline {
                ctx,
                raw,
                exportable: export,
                signalled: AtomicU64::new(0),
            }),
        })
    }

    /// Has `timeline` reach `value` on the GPU once all work submitted so far has finished:
    /// on the compute queue, and on the transfer queue where there is one. Submits the open
    /// batch; the host does not wait. `value` must exceed every value signalled so far.
    pub fn signal_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        let t = self.own_timeline(timeline)?;
        t.claim(value, "signal_external")?;
        self.submit_signal(Arc::clone(t), value)
    }

    /// Has every GPU command recorded after this call wait, on the GPU, until `timeline`
    /// reaches `value` (the next batch on each queue waits at all stages). Submits the open
    /// batch first, so nothing recorded before waits; the host does not wait. See the module
    /// documentation for what this means for host waits and read-backs.
    pub fn wait_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        let t = self.own_timeline(timeline)?;
        if value <= t.value()? {
            return Ok(()); // reached already, and a timeline never goes back
        }
        self.submit_then_wait(t, value)
    }

    /// Submits the open batch (an empty one if none is open) with `timeline` to be signalled
    /// to `value`, after a wait for every copy submitted to the transfer queue: the signal
    /// follows all work submitted so far on both queues.
    fn submit_signal(&self, timeline: Arc<Timeline>, value: u64) -> Result<()> {
        self.check_submits()?;
        {
            let (mut enc, _g) = self.lock_encoder()?;
            let mut batch = self.take_open_batch(&mut enc);
            if let Some(q) = &self.copy_queue {
                batch.wait_transfer = batch.wait_transfer.max(q.last_submitted());
            }
            batch.external_signals.push((timeline, value));
            self.submit_counted(&mut enc, batch)?;
        }
        self.drain()
    }

    /// Submits the open batch, then has the next batch on each queue wait for `timeline` to
    /// reach `value`.
    fn submit_then_wait(&self, timeline: &Arc<Timeline>, value: u64) -> Result<()> {
        self.check_submits()?;
        let (mut enc, _g) = self.lock_encoder()?;
        // What was recorded before the call must not wait: a host read of it would then
        // wait for the external value too.
        if let Some(batch) = enc.open.take() {
            self.submit_counted(&mut enc, batch)?;
        }
        enc.wait_next(timeline, value);
        if let Some(q) = &self.copy_queue {
            q.add_external_wait(timeline, value);
        }
        Ok(())
    }

    fn own_timeline<'t>(&self, timeline: &'t ExternalTimeline) -> Result<&'t Arc<Timeline>> {
        let t = &timeline.shared;
        if std::ptr::eq(Arc::as_ptr(&t.ctx), self) {
            Ok(t)
        } else {
            Err(Error::ForeignObject {
                what: "the external timeline",
            })
        }
    }

    /// Why `what` cannot be exported here.
    fn export_unsupported(&self, what: Shared) -> Error {
        let x = &self.caps().external;
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
            device: self.caps().name.clone(),
            reason,
        }
    }
}
