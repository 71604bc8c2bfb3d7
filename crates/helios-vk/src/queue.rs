//! The queues' own state: the compute queue's (its timeline semaphore, the ring of command
//! buffers, the batches in flight) and the dedicated transfer queue's. The Context submits
//! and waits through them (submit.rs, copy_queue.rs).

use crate::sync::LockExt;
use ash::vk;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::error::{vk_err, Error, Result};
use crate::external::{ExternalSignals, ExternalWaits, Timeline};
use crate::memory::Buffer;
use crate::native::NativeKernel;
use crate::pipeline::Pipeline;

/// The compute queue (submit.rs).
pub(crate) struct Submitter {
    pub(crate) timeline: vk::Semaphore,
    /// The queue and the last value signalled on it, locked together so that signal values
    /// increase in submission order, as the spec requires.
    pub(crate) queue: Mutex<QueueState>,
    pub(crate) ring: Mutex<CommandRing>,
    /// Whether the last submitted batch launched native kernels: the next batch's opening
    /// barrier must then cover all commands too. Batches are submitted one at a time, in
    /// order (worker.rs).
    pub(crate) native_tail: AtomicBool,
}

pub(crate) struct QueueState {
    pub(crate) queue: vk::Queue,
    pub(crate) last_submitted: u64,
}

/// One transient pool with one primary command buffer: recording into it needs no lock
/// because nobody else can reach the pool while the slot is checked out.
pub(crate) struct Slot {
    pub(crate) pool: vk::CommandPool,
    pub(crate) cb: vk::CommandBuffer,
}

impl Slot {
    /// A transient pool for `family` with one primary command buffer. The caller records the
    /// pool for destruction.
    pub(crate) fn new(device: &ash::Device, family: u32) -> Result<Slot> {
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::TRANSIENT)
            .queue_family_index(family);
        // SAFETY: valid device.
        let pool = unsafe { device.create_command_pool(&info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool was just created.
        match unsafe { device.allocate_command_buffers(&alloc) } {
            Ok(cbs) => Ok(Slot { pool, cb: cbs[0] }),
            Err(r) => {
                // SAFETY: nothing was allocated from the pool.
                unsafe { device.destroy_command_pool(pool, None) };
                Err(Error::vk("vkAllocateCommandBuffers", r))
            }
        }
    }

    /// Resets the pool for reuse; false if the driver refused.
    pub(crate) fn reset(&self, device: &ash::Device) -> bool {
        // SAFETY: callers reset only slots whose command buffer is not pending (never
        // submitted, or its timeline value has completed).
        unsafe { device.reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty()) }.is_ok()
    }
}

/// A submitted batch: its command buffer and the pipelines, native kernels and external
/// semaphores it uses.
pub(crate) struct InFlight {
    pub(crate) value: u64,
    pub(crate) slot: Slot,
    pub(crate) _keep: Vec<Arc<Pipeline>>,
    pub(crate) _keep_native: Vec<Arc<NativeKernel>>,
    pub(crate) _keep_waits: ExternalWaits,
    pub(crate) _keep_signals: ExternalSignals,
}

pub(crate) struct CommandRing {
    pub(crate) queue_family: u32,
    pub(crate) free: Vec<Slot>,
    /// (timeline value, slot) in submission order.
    pub(crate) in_flight: VecDeque<InFlight>,
    /// Every pool ever created, destroyed with the ring (covers slots lost to a panic).
    pub(crate) all_pools: Vec<vk::CommandPool>,
}

impl Submitter {
    pub(crate) fn new(device: &ash::Device, queue: vk::Queue, queue_family: u32) -> Result<Self> {
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid device; timeline semaphores are a required, enabled feature.
        let timeline = unsafe { device.create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore(timeline)"))?;
        Ok(Submitter {
            timeline,
            queue: Mutex::new(QueueState {
                queue,
                last_submitted: 0,
            }),
            ring: Mutex::new(CommandRing {
                queue_family,
                free: Vec::new(),
                in_flight: VecDeque::new(),
                all_pools: Vec::new(),
            }),
            native_tail: AtomicBool::new(false),
        })
    }

    /// Destroys the pools and the semaphore.
    ///
    /// # Safety
    /// The device must be idle and the Submitter unused afterwards.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        let ring = self.ring.locked();
        for &pool in &ring.all_pools {
            device.destroy_command_pool(pool, None);
        }
        device.destroy_semaphore(self.timeline, None);
    }
}

/// A submitted copy: its command buffer and what it keeps alive until it completes.
pub(crate) struct CopyInFlight {
    pub(crate) value: u64,
    pub(crate) slot: Slot,
    /// Staging buffers the copy reads or writes, released when it completes.
    pub(crate) keep: Vec<Buffer>,
    /// External semaphores the copy waited for, kept until it completes.
    pub(crate) _waits: ExternalWaits,
}

pub(crate) struct CopyState {
    pub(crate) last_submitted: u64,
    pub(crate) free: Vec<Slot>,
    pub(crate) in_flight: VecDeque<CopyInFlight>,
    pub(crate) all_pools: Vec<vk::CommandPool>,
    /// External waits for the next copy (`Context::wait_external`).
    pub(crate) waits: ExternalWaits,
}

/// The dedicated transfer queue (copy_queue.rs).
pub(crate) struct CopyQueue {
    pub(crate) family: u32,
    pub(crate) queue: vk::Queue,
    pub(crate) timeline: vk::Semaphore,
    pub(crate) state: Mutex<CopyState>,
}

impl CopyQueue {
    pub(crate) fn new(device: &ash::Device, family: u32) -> Result<CopyQueue> {
        // SAFETY: the family was requested with one queue at device creation.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid device; timeline semaphores are enabled.
        let timeline = unsafe { device.create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore(transfer timeline)"))?;
        Ok(CopyQueue {
            family,
            queue,
            timeline,
            state: Mutex::new(CopyState {
                last_submitted: 0,
                free: Vec::new(),
                in_flight: VecDeque::new(),
                all_pools: Vec::new(),
                waits: ExternalWaits::default(),
            }),
        })
    }

    /// Has the next copy wait for `timeline` to reach `value`.
    pub(crate) fn add_external_wait(&self, timeline: &Arc<Timeline>, value: u64) {
        self.state.locked().waits.add(timeline, value);
    }

    /// # Safety
    /// The device must be idle.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        let mut state = self.state.locked();
        state.in_flight.clear();
        for &pool in &state.all_pools {
            device.destroy_command_pool(pool, None);
        }
        device.destroy_semaphore(self.timeline, None);
    }

    pub(crate) fn last_submitted(&self) -> u64 {
        self.state.locked().last_submitted
    }
}
