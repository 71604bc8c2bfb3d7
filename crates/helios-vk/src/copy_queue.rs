//! The dedicated transfer queue: staged uploads and read-backs on the copy engine, beside the
//! compute queue, ordered by the two queues' timeline semaphores.
//!
//! Where a device has a transfer-only queue family (NVIDIA: two queues), staging copies run
//! there so they overlap compute. Ordering needs no host waits: a copy waits on the compute
//! timeline for the last compute use of what it touches, and a compute batch waits on the
//! transfer timeline for the last copy that touched its buffers (`Buffer::transfer_use`,
//! which the encoder folds into the batch's semaphore waits). Buffers are created with
//! concurrent sharing between the two families, so no ownership transfers are needed.
//! Staging buffers ride along with their copy and are dropped (back to the pool) once it
//! completes. The queue's state is in queue.rs; here are the Context's methods that submit
//! copies to it and wait for them.

use crate::sync::LockExt;
use ash::vk;

use crate::context::Context;
use crate::error::{vk_err, Error, Result};
use crate::memory::Buffer;
use crate::queue::{CopyInFlight, CopyState, Slot};
use crate::recorder::MAX_COPY_REGION;

/// One copy: `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
pub(crate) struct Copy<'a> {
    pub src: &'a Buffer,
    pub src_offset: u64,
    pub dst: &'a Buffer,
    pub dst_offset: u64,
    pub len: u64,
}

impl Context {
    /// The transfer timeline value the copy engine has reached.
    pub(crate) fn copies_completed(&self) -> Result<u64> {
        match &self.copy_queue {
            // SAFETY: the semaphore belongs to this device.
            Some(q) => unsafe { self.device().get_semaphore_counter_value(q.timeline) }
                .map_err(vk_err("vkGetSemaphoreCounterValue(transfer)")),
            None => Ok(0),
        }
    }

    /// Submits `copies` on the transfer queue after the compute timeline reaches
    /// `after_compute`; returns the transfer timeline value that signals their completion.
    /// The compute batch holding `after_compute` must already be submitted.
    pub(crate) fn submit_copies(&self, copies: &[Copy<'_>], after_compute: u64) -> Result<u64> {
        let q = self.copy_queue.as_ref().expect("caller checked");
        debug_assert!(after_compute <= self.last_submitted(), "wait before signal");
        self.retire_copies(self.copies_completed()?);
        let device = self.device();
        let slot = {
            let mut state = q.state.locked();
            match state.free.pop() {
                Some(slot) => slot,
                None => {
                    let slot = Slot::new(device, q.family)?;
                    state.all_pools.push(slot.pool);
                    slot
                }
            }
        };
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the slot's pool was reset (or is new), so the buffer is initial.
        let recorded = unsafe {
            device
                .begin_command_buffer(slot.cb, &begin)
                .map_err(vk_err("vkBeginCommandBuffer(transfer)"))
                .and_then(|_| {
                    // Earlier copies on this queue (same-queue submission order does not
                    // make their writes visible).
                    let barrier = vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                        .dst_access_mask(
                            vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE,
                        );
                    device.cmd_pipeline_barrier(
                        slot.cb,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::DependencyFlags::empty(),
                        &[barrier],
                        &[],
                        &[],
                    );
                    for c in copies {
                        let regions: Vec<vk::BufferCopy> = (0..c.len)
                            .step_by(MAX_COPY_REGION as usize)
                            .map(|start| vk::BufferCopy {
                                src_offset: c.src.offset() + c.src_offset + start,
                                dst_offset: c.dst.offset() + c.dst_offset + start,
                                size: (c.len - start).min(MAX_COPY_REGION),
                            })
                            .collect();
                        device.cmd_copy_buffer(slot.cb, c.src.raw(), c.dst.raw(), &regions);
                    }
                    // Make the copies' writes visible to the host (read-backs).
                    let host = vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                        .dst_access_mask(vk::AccessFlags::HOST_READ);
                    device.cmd_pipeline_barrier(
                        slot.cb,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &[host],
                        &[],
                        &[],
                    );
                    device
                        .end_command_buffer(slot.cb)
                        .map_err(vk_err("vkEndCommandBuffer(transfer)"))
                })
        };
        let mut state = q.state.locked();
        if let Err(e) = recorded {
            release(device, &mut state, slot);
            return Err(e);
        }
        let value = state.last_submitted + 1;
        let compute_timeline = self.submitter.timeline;
        let (mut wait_sems, mut wait_values, mut wait_stages) = if after_compute > 0 {
            (
                vec![compute_timeline],
                vec![after_compute],
                vec![vk::PipelineStageFlags::TRANSFER],
            )
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        // Copies recorded after `wait_external` wait for its value, as compute batches do.
        let external = state.waits.take();
        for (semaphore, v) in external.iter() {
            wait_sems.push(semaphore);
            wait_values.push(v);
            wait_stages.push(vk::PipelineStageFlags::ALL_COMMANDS);
        }
        let signal_values = [value];
        let signals = [q.timeline];
        let cbs = [slot.cb];
        let mut timeline_info = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems)
            .wait_dst_stage_mask(&wait_stages)
            .command_buffers(&cbs)
            .signal_semaphores(&signals)
            .push_next(&mut timeline_info);
        // SAFETY: the command buffer is executable; the queue is used only under this lock.
        if let Err(r) = unsafe { device.queue_submit(q.queue, &[submit], vk::Fence::null()) } {
            release(device, &mut state, slot);
            state.waits.restore(external);
            return Err(Error::vk("vkQueueSubmit(transfer)", r));
        }
        state.last_submitted = value;
        for c in copies {
            c.src.mark_transfer(value);
            c.dst.mark_transfer(value);
        }
        state.in_flight.push_back(CopyInFlight {
            value,
            slot,
            keep: Vec::new(),
            _waits: external,
        });
        Ok(value)
    }

    /// Keeps `buffer` (a staging buffer) alive until the copy that signals `value` completes.
    pub(crate) fn keep_until_copied(&self, value: u64, buffer: Buffer) {
        let Some(q) = &self.copy_queue else { return };
        let mut state = q.state.locked();
        if let Some(f) = state.in_flight.iter_mut().find(|f| f.value == value) {
            f.keep.push(buffer);
            return;
        }
        drop(state);
        // Already retired: the copy is complete, the buffer may go back to the pool.
        drop(buffer);
    }

    /// Blocks until the transfer timeline reaches `value` (polling first, as `wait` does).
    pub(crate) fn wait_copies(&self, value: u64) -> Result<()> {
        let Some(q) = &self.copy_queue else {
            return Ok(());
        };
        let done = self.wait_timeline(q.timeline, value, || self.copies_completed())?;
        self.retire_copies(done);
        Ok(())
    }

    /// Recycles completed copies' command buffers and drops their staging buffers.
    pub(crate) fn retire_copies(&self, completed: u64) {
        let Some(q) = &self.copy_queue else { return };
        let done: Vec<CopyInFlight> = {
            let mut state = q.state.locked();
            let n = state
                .in_flight
                .iter()
                .take_while(|f| f.value <= completed)
                .count();
            state.in_flight.drain(..n).collect()
        };
        if done.is_empty() {
            return;
        }
        let device = self.device();
        let mut slots = Vec::with_capacity(done.len());
        for f in done {
            slots.push(f.slot);
            // Staging buffers return to the pool here, outside the lock.
            drop(f.keep);
        }
        let mut state = q.state.locked();
        for slot in slots {
            release(device, &mut state, slot);
        }
    }
}

fn release(device: &ash::Device, state: &mut CopyState, slot: Slot) {
    // The slot's command buffer is not pending here (never submitted, or retired).
    if slot.reset(device) {
        state.free.push(slot);
    }
}
