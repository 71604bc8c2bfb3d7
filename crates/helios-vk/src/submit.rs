//! Submission: command buffers from a ring, one timeline semaphore, submit/wait/completed.
//!
//! Every batch signals the next value of the Context's timeline semaphore; buffers remember
//! the values of their last write and use, and the host waits for exactly those. Command
//! buffers come from a ring of small pools, each reused only once the timeline has passed its
//! value.
//!
//! Every command buffer starts with a global barrier against all earlier work on the queue
//! and ends with a barrier that makes device writes visible to the host: hazards *inside* a
//! batch are the encoder's business, these two cover the ones between batches and host reads.
//!
//! The queue's state (the semaphore, the ring, the batches in flight) is in queue.rs; here
//! are the Context's methods that submit to it and wait for it.

use crate::sync::LockExt;
use ash::vk;
use std::sync::atomic::Ordering;

use crate::batch::OpenBatch;
use crate::commands;
use crate::context::Context;
use crate::error::{vk_err, Error, Result};
use crate::queue::{InFlight, Slot};

/// Batches submitted and not yet known complete before a submit waits for the oldest.
const MAX_IN_FLIGHT: usize = 16;

/// The submit thread's side (worker.rs): batches are submitted to their Context.
impl crate::worker::Submits for Context {
    type Batch = OpenBatch;

    fn submit_batch(&self, batch: OpenBatch) -> Result<()> {
        Context::submit_batch(self, batch)
    }
}

impl Context {
    /// Queues a closed batch for the submit thread (or submits it here where there is none).
    pub(crate) fn enqueue(&self, batch: OpenBatch) -> Result<()> {
        let ctx = self.me.upgrade().expect("a Context in use has a handle");
        self.jobs.push(ctx, batch, self.has_worker);
        match self.has_worker {
            true => Ok(()),
            false => self.drain(),
        }
    }

    /// Submits every queued batch on this thread (the submit thread may take some first).
    pub(crate) fn drain(&self) -> Result<()> {
        while self.jobs.run_next() {}
        self.check_submits()
    }

    /// The first failed submission, if there was one: nothing submits after it.
    pub(crate) fn check_submits(&self) -> Result<()> {
        self.jobs.check()
    }

    /// Host time spent recording and submitting batches so far, ns.
    pub(crate) fn submit_ns(&self) -> u64 {
        self.jobs.submit_ns()
    }

    /// A command buffer from the ring, begun, with a barrier against all earlier work on the
    /// queue (submission order alone does not make earlier writes visible); over all
    /// commands where native launches are on either side (`native`).
    fn begin_slot(&self, native: bool) -> Result<Slot> {
        let slot = self.acquire_slot()?;
        let device = self.device();
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the slot's pool was reset, so its command buffer is in the initial state.
        if let Err(r) = unsafe { device.begin_command_buffer(slot.cb, &begin) } {
            self.release_slot(slot);
            return Err(Error::vk("vkBeginCommandBuffer", r));
        }
        if native {
            commands::native_barrier(device, slot.cb);
        } else {
            commands::compute_transfer_barrier(device, slot.cb);
        }
        Ok(slot)
    }

    /// Returns a slot whose recording failed, unsubmitted.
    fn abandon_slot(&self, slot: Slot) {
        self.discard_profile();
        self.release_slot(slot);
    }

    /// Tells the profiler that the spans recorded since the last submit will never run.
    fn discard_profile(&self) {
        if let Some(p) = &self.core.profiler {
            p.discarded();
        }
    }

    /// Records the batch's commands into a command buffer and submits it, signalling
    /// `batch.value`. Keeps the batch's pipelines alive until that value completes. Waits
    /// first if too many batches are in flight, so the host cannot run unboundedly ahead of
    /// the GPU. Runs on the submit thread, or wherever a queue is drained (worker.rs).
    pub(crate) fn submit_batch(&self, batch: OpenBatch) -> Result<()> {
        let device = self.device();
        let s = &self.submitter;
        let OpenBatch {
            commands,
            value,
            keep,
            keep_native,
            wait_transfer,
            external_waits,
            external_signals,
            ..
        } = batch;
        let native = commands.native;
        // Deferred compiles the batch uses end here (on the submit thread, as a rule).
        let resolved = commands.resolve()?;
        let slot = self.begin_slot(native || s.native_tail.load(Ordering::Acquire))?;
        // SAFETY: the command buffer is recording; the batch keeps its pipelines, and its
        // buffers outlive their last use (pool tags, or `submit`'s contract).
        unsafe { commands.replay(&self.core, slot.cb, &resolved) };
        self.recycle_commands(commands);
        commands::host_read_barrier(device, slot.cb, native);
        // SAFETY: the command buffer is recording.
        if let Err(r) = unsafe { device.end_command_buffer(slot.cb) } {
            self.abandon_slot(slot);
            return Err(Error::vk("vkEndCommandBuffer", r));
        }
        let oldest = s.ring.locked().in_flight.front().map(|f| f.value);
        if let Some(oldest) = oldest {
            if s.ring.locked().in_flight.len() >= MAX_IN_FLIGHT {
                self.wait(oldest)?;
            }
        }

        let mut q = s.queue.locked();
        debug_assert_eq!(
            value,
            q.last_submitted + 1,
            "batches signal consecutive values"
        );
        // The Context's timeline, then any external ones (external.rs).
        let mut signals = vec![s.timeline];
        let mut signal_values = vec![value];
        for (t, v) in &external_signals {
            signals.push(t.raw);
            signal_values.push(*v);
        }
        let cbs = [slot.cb];
        let (mut wait_sems, mut wait_values, mut wait_stages) =
            (Vec::new(), Vec::new(), Vec::new());
        // Copies on the transfer queue this batch depends on (copy_queue.rs). Before an
        // external signal the whole batch waits, so the signal follows the copies.
        if let (Some(cq), true) = (&self.copy_queue, wait_transfer > 0) {
            wait_sems.push(cq.timeline);
            wait_values.push(wait_transfer);
            wait_stages.push(match native || !external_signals.is_empty() {
                true => vk::PipelineStageFlags::ALL_COMMANDS,
                false => vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
            });
        }
        // External values: nothing in the batch may start before them.
        for (semaphore, v) in external_waits.iter() {
            wait_sems.push(semaphore);
            wait_values.push(v);
            wait_stages.push(vk::PipelineStageFlags::ALL_COMMANDS);
        }
        let mut timeline_info = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems)
            .wait_dst_stage_mask(&wait_stages)
            .command_buffers(&cbs)
            .signal_semaphores(&signals)
            .push_next(&mut timeline_info);
        // SAFETY: the command buffer is executable; the queue is externally synchronized by
        // the queue lock.
        if let Err(r) = unsafe { device.queue_submit(q.queue, &[submit], vk::Fence::null()) } {
            drop(q);
            self.abandon_slot(slot);
            return Err(Error::vk("vkQueueSubmit", r));
        }
        q.last_submitted = value;
        s.native_tail.store(native, Ordering::Release);
        if let Some(p) = &self.core.profiler {
            p.submitted(value);
        }
        // Pushed under the queue lock so that `in_flight` stays sorted by value.
        s.ring.locked().in_flight.push_back(InFlight {
            value,
            slot,
            _keep: keep,
            _keep_native: keep_native,
            _keep_waits: external_waits,
            _keep_signals: external_signals,
        });
        Ok(())
    }

    /// Blocks until the timeline reaches `value` (flushing the open batch first if `value`
    /// is its value). Polls the timeline for a short while before sleeping in the driver:
    /// a blocking wait costs tens of microseconds of wake-up latency, which a short GPU job
    /// would otherwise pay on every read-back.
    pub fn wait(&self, value: u64) -> Result<()> {
        if value > self.last_submitted() {
            self.flush()?;
        }
        self.check_submits()?;
        let last_submitted = self.last_submitted();
        if value > last_submitted {
            return Err(Error::WaitOnUnsubmitted {
                value,
                last_submitted,
            });
        }
        let done = self.wait_timeline(self.submitter.timeline, value, || self.completed())?;
        self.retire(done);
        Ok(())
    }

    /// Waits until `semaphore` reaches `value`: polls `completed` for up to the spin time
    /// (waking from a blocking wait costs about 100 µs on a VM host, which every step that
    /// ends in a host wait would otherwise pay), then blocks in the driver. Past
    /// `YIELD_AFTER` the poll gives the core to any other runnable thread between reads.
    /// Returns the value reached.
    pub(crate) fn wait_timeline(
        &self,
        semaphore: vk::Semaphore,
        value: u64,
        completed: impl Fn() -> Result<u64>,
    ) -> Result<u64> {
        /// How long a wait polls with the CPU's spin hint only.
        const YIELD_AFTER: std::time::Duration = std::time::Duration::from_millis(1);
        let start = std::time::Instant::now();
        loop {
            let done = completed()?;
            if done >= value {
                return Ok(done);
            }
            let waited = start.elapsed();
            if waited >= self.spin {
                break;
            }
            if waited >= YIELD_AFTER {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let semaphores = [semaphore];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: the semaphore belongs to this device and `value` has been submitted, so
        // the wait terminates unless the device is lost (reported as an error).
        unsafe { self.device().wait_semaphores(&info, u64::MAX) }
            .map_err(vk_err("vkWaitSemaphores"))?;
        Ok(value)
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
        self.submitter.queue.locked().last_submitted
    }

    /// Takes a free command buffer, recycling pools whose work has completed.
    fn acquire_slot(&self) -> Result<Slot> {
        let completed = self.completed()?;
        self.retire(completed);
        let device = self.device();
        let mut ring = self.submitter.ring.locked();
        if let Some(slot) = ring.free.pop() {
            return Ok(slot);
        }
        let slot = Slot::new(device, ring.queue_family)?;
        ring.all_pools.push(slot.pool);
        Ok(slot)
    }

    /// Resets a slot and puts it back on the free list.
    fn release_slot(&self, slot: Slot) {
        // A pool that fails to reset is left alone; it is still destroyed with the ring.
        if slot.reset(self.device()) {
            self.submitter.ring.locked().free.push(slot);
        }
    }

    /// Recycles every in-flight slot whose value is `<= completed` (and drops the pipelines
    /// it kept alive).
    fn retire(&self, completed: u64) {
        let done: Vec<InFlight> = {
            let mut ring = self.submitter.ring.locked();
            let n = ring
                .in_flight
                .iter()
                .take_while(|f| f.value <= completed)
                .count();
            ring.in_flight.drain(..n).collect()
        };
        for f in done {
            self.release_slot(f.slot);
        }
        if let Some(p) = &self.core.profiler {
            // Reading finished spans is what frees their query pools; a failure here only
            // loses profile data.
            let _ = p.collect(completed);
        }
    }
}
