// Submission: command buffers from a ring, one timeline semaphore, submit/wait/completed.
//
// Every submit signals the next value of the Context's timeline semaphore; that value is the
// only handle the async engine will need (`submit() -> u64`, `completed()`, `wait(v)`).
// Command buffers come from a ring of small pools, each reused only once the timeline has
// passed its value. Recording happens with no lock held, so a recording closure may itself
// call `upload`/`submit_and_wait` without deadlocking.
//
// Every command buffer starts with a global barrier against all earlier work on the queue
// and ends with a barrier that makes device writes visible to the host. The synchronous
// runtime does not track hazards between submits; these two barriers make every
// submission safe against the previous ones and against host reads after `wait`.

use ash::vk;
use std::collections::VecDeque;
use std::sync::Mutex;

use crate::context::Context;
use crate::error::{vk_err, Error, Result};
use crate::recorder::{self, Recorder};

pub(crate) struct Submitter {
    timeline: vk::Semaphore,
    /// The queue and the last value signalled on it, locked together so that signal values
    /// increase in submission order, as the spec requires.
    queue: Mutex<QueueState>,
    ring: Mutex<CommandRing>,
}

struct QueueState {
    queue: vk::Queue,
    last_submitted: u64,
}

/// One transient pool with one primary command buffer: recording into it needs no lock
/// because nobody else can reach the pool while the slot is checked out.
struct Slot {
    pool: vk::CommandPool,
    cb: vk::CommandBuffer,
}

struct CommandRing {
    queue_family: u32,
    free: Vec<Slot>,
    /// (timeline value, slot) in submission order.
    in_flight: VecDeque<(u64, Slot)>,
    /// Every pool ever created, destroyed with the ring (covers slots lost to a panic).
    all_pools: Vec<vk::CommandPool>,
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
        })
    }

    /// Destroys the pools and the semaphore.
    ///
    /// # Safety
    /// The device must be idle and the Submitter unused afterwards.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        let ring = lock(&self.ring);
        for &pool in &ring.all_pools {
            device.destroy_command_pool(pool, None);
        }
        device.destroy_semaphore(self.timeline, None);
    }
}

impl Context {
    /// Records with `record`, submits, and waits for completion.
    pub fn submit_and_wait<F>(&self, record: F) -> Result<()>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<()>,
    {
        // SAFETY: we wait before returning, so everything `record` borrowed outlives the GPU
        // work.
        let value = unsafe { self.submit(record)? };
        self.wait(value)
    }

    /// Records with `record`, submits, and returns the timeline value that signals
    /// completion, without waiting.
    ///
    /// # Safety
    /// Every buffer and pipeline the recorded commands use (including buffers reached
    /// through device addresses in push constants) must stay alive until `wait(value)`
    /// returns or `completed() >= value`.
    pub unsafe fn submit<F>(&self, record: F) -> Result<u64>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<()>,
    {
        let device = self.device();
        let s = &self.submitter;
        let slot = self.acquire_slot()?;
        let recorded = (|| {
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            device
                .begin_command_buffer(slot.cb, &begin)
                .map_err(vk_err("vkBeginCommandBuffer"))?;
            recorder::compute_transfer_barrier(device, slot.cb);
            let mut rec = Recorder::new(self, slot.cb);
            record(&mut rec)?;
            recorder::host_read_barrier(device, slot.cb);
            device
                .end_command_buffer(slot.cb)
                .map_err(vk_err("vkEndCommandBuffer"))
        })();
        if let Err(e) = recorded {
            self.release_slot(slot);
            return Err(e);
        }

        let mut q = lock(&s.queue);
        let value = q.last_submitted + 1;
        let signal_values = [value];
        let signals = [s.timeline];
        let cbs = [slot.cb];
        let mut timeline_info =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .command_buffers(&cbs)
            .signal_semaphores(&signals)
            .push_next(&mut timeline_info);
        if let Err(r) = device.queue_submit(q.queue, &[submit], vk::Fence::null()) {
            drop(q);
            self.release_slot(slot);
            return Err(Error::vk("vkQueueSubmit", r));
        }
        q.last_submitted = value;
        // Pushed under the queue lock so that `in_flight` stays sorted by value.
        lock(&s.ring).in_flight.push_back((value, slot));
        Ok(value)
    }

    /// Blocks until the timeline reaches `value` (a value returned by `submit`).
    pub fn wait(&self, value: u64) -> Result<()> {
        let last_submitted = self.last_submitted();
        if value > last_submitted {
            return Err(Error::WaitOnUnsubmitted {
                value,
                last_submitted,
            });
        }
        let semaphores = [self.submitter.timeline];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: the semaphore belongs to this device and `value` has been submitted, so
        // the wait terminates unless the device is lost (reported as an error).
        unsafe { self.device().wait_semaphores(&info, u64::MAX) }
            .map_err(vk_err("vkWaitSemaphores"))?;
        self.retire(value);
        Ok(())
    }

    /// The timeline value the GPU has reached (no waiting).
    pub fn completed(&self) -> Result<u64> {
        // SAFETY: the semaphore belongs to this device.
        unsafe {
            self.device()
                .get_semaphore_counter_value(self.submitter.timeline)
        }
        .map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// The value signalled by the most recent submit (0 before any).
    pub fn last_submitted(&self) -> u64 {
        lock(&self.submitter.queue).last_submitted
    }

    /// Takes a free command buffer, recycling pools whose work has completed.
    fn acquire_slot(&self) -> Result<Slot> {
        let completed = self.completed()?;
        self.retire(completed);
        let device = self.device();
        let mut ring = lock(&self.submitter.ring);
        if let Some(slot) = ring.free.pop() {
            return Ok(slot);
        }
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::TRANSIENT)
            .queue_family_index(ring.queue_family);
        // SAFETY: valid device; the pool is recorded in `all_pools` for destruction.
        let pool = unsafe { device.create_command_pool(&info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        ring.all_pools.push(pool);
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool was just created and is owned by this ring.
        let cb = unsafe { device.allocate_command_buffers(&alloc) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?[0];
        Ok(Slot { pool, cb })
    }

    /// Resets a slot and puts it back on the free list.
    fn release_slot(&self, slot: Slot) {
        // SAFETY: the slot's command buffer is not pending (never submitted, or its timeline
        // value has completed), so its pool may be reset.
        let reset = unsafe {
            self.device()
                .reset_command_pool(slot.pool, vk::CommandPoolResetFlags::empty())
        };
        // A pool that fails to reset is left alone; it is still destroyed with the ring.
        if reset.is_ok() {
            lock(&self.submitter.ring).free.push(slot);
        }
    }

    /// Recycles every in-flight slot whose value is `<= completed`.
    fn retire(&self, completed: u64) {
        let done: Vec<Slot> = {
            let mut ring = lock(&self.submitter.ring);
            let n = ring
                .in_flight
                .iter()
                .take_while(|(v, _)| *v <= completed)
                .count();
            ring.in_flight.drain(..n).map(|(_, slot)| slot).collect()
        };
        for slot in done {
            self.release_slot(slot);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded state stays consistent at every await-free point, so a poisoned lock
    // (a panic in another thread) is still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
