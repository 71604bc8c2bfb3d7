//! The encoder: many dispatches recorded into one command buffer, barriers only on real
//! hazards, submitted in batches that signal the queue's timeline.
//!
//! Every GPU command goes through the one open batch of the Context, so the batch's timeline
//! value is known when it opens (the last submitted value + 1) and buffers can remember it
//! as the value of their last write and use. A dispatch declares the buffers it reads and
//! writes; the encoder keeps the accesses since the last barrier and inserts a
//! compute→compute barrier only for read-after-write, write-after-read or write-after-write on
//! overlapping bytes, none between independent dispatches. The batch is submitted when it
//! reaches the dispatch threshold, when the host needs a result, or on `flush`; submitting
//! never waits unless too many batches are already in flight.
//!
//! The batch itself and its hazard tracking are in batch.rs. Recording here only lists the
//! commands (recorder.rs, commands.rs): a closed batch goes to the submit thread, which
//! records its command buffer and submits it (worker.rs), while this thread goes on with the
//! next batch. `flush` (and every host wait) submits what is queued itself.

use crate::sync::LockExt;
use ash::vk;
use std::cell::Cell;
use std::sync::{Arc, MutexGuard};

use crate::batch::{Access, Encoder, EncoderStats, OpenBatch, Stage, Stages};
use crate::commands::Commands;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::external::{self, ExternalTimeline, Timeline};
use crate::memory::Buffer;
use crate::native::{self, NativeArg, NativeKernel};
use crate::pipeline::Pipeline;
use crate::recorder::{self, Recorder};

/// While the GPU is busy the encoder checks every this many dispatches whether it has
/// finished everything submitted, and if so submits the open batch at once (see
/// `with_batch`). The check is one semaphore read.
const EARLY_CHECK: u32 = 8;

/// Most dispatches in a batch that `with_batch` submits on the recording thread when the
/// GPU has run dry (larger batches, and full ones, go to the submit thread): the first
/// dispatch after an idle spell, so the GPU starts without waiting for the submit thread to
/// wake. Each inline batch is the driver's recording work on this thread, so larger values
/// measured slower on a host-bound step and no faster on GPT-2 (on an H100 host; figures in
/// bench/results/source-comment-history.md).
const INLINE_MAX: u32 = 1;

/// See [`Context::hold_submits`].
pub struct SubmitHold<'a> {
    ctx: &'a Context,
}

impl Drop for SubmitHold<'_> {
    fn drop(&mut self) {
        self.ctx.encoder.locked().held -= 1;
    }
}

thread_local! {
    /// Set while this thread holds the encoder: recording closures that call back into the
    /// Context get an error instead of a deadlock.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
}

pub(crate) struct RecordingGuard;

impl Drop for RecordingGuard {
    fn drop(&mut self) {
        RECORDING.with(|r| r.set(false));
    }
}

/// Replayed command lists kept for the next batches (see `Context::recycle_commands`).
const SPARE_COMMANDS: usize = 4;

impl Context {
    /// An empty command list for a new batch: a recycled one where there is one.
    fn spare_commands(&self) -> Commands {
        let mut spare = self.spare_commands.locked();
        spare.pop().unwrap_or_default()
    }

    /// The open batch, taken out of the encoder to be closed, or a new empty one.
    pub(crate) fn take_open_batch(&self, enc: &mut Encoder) -> OpenBatch {
        match enc.open.take() {
            Some(batch) => batch,
            None => {
                let commands = self.spare_commands();
                enc.open_batch(commands, Stages::NONE, 0)
            }
        }
    }

    /// Keeps a replayed batch's command list, emptied, for a later batch. A step of a small
    /// model records a few batches of up to `DEFAULT_BATCH` dispatches; growing fresh lists
    /// for each showed in profiles of the recording thread
    /// (bench/results/source-comment-history.md).
    pub(crate) fn recycle_commands(&self, mut commands: Commands) {
        commands.clear();
        let mut spare = self.spare_commands.locked();
        if spare.len() < SPARE_COMMANDS {
            spare.push(commands);
        }
    }

    /// Counts `batch` and hands it to the submit thread.
    pub(crate) fn submit_counted(&self, enc: &mut Encoder, batch: OpenBatch) -> Result<()> {
        enc.count(&batch);
        enc.enqueued = batch.value;
        self.enqueue(batch)
    }

    pub(crate) fn lock_encoder(&self) -> Result<(MutexGuard<'_, Encoder>, RecordingGuard)> {
        if RECORDING.with(|r| r.get()) {
            return Err(Error::Reentrant);
        }
        let guard = self.encoder.locked();
        RECORDING.with(|r| r.set(true));
        Ok((guard, RecordingGuard))
    }

    /// Runs `f` on the open batch (opening one if needed), then submits the batch if it has
    /// reached the dispatch threshold.
    pub(crate) fn with_batch<R>(&self, f: impl FnOnce(&mut OpenBatch) -> Result<R>) -> Result<R> {
        self.check_submits()?;
        let (mut enc, _g) = self.lock_encoder()?;
        if enc.open.is_none() {
            // A new command buffer begins with a full barrier (submit.rs).
            let commands = self.spare_commands();
            enc.open = Some(enc.open_batch(commands, Stages::NONE, 0));
        }
        let batch = enc.open.as_mut().expect("opened above");
        let out = f(batch)?;
        let n = batch.dispatches;
        // Submit at the threshold, or early when the GPU has run dry: a long batch recorded
        // while the GPU idles would otherwise cost recording time plus execution time. After
        // a host wait the GPU is idle, so the first dispatch goes at once; when the host is
        // the bottleneck the GPU is always dry, so each early submit doubles the wait for the
        // next one (a submit costs microseconds); finding the GPU busy means it is the
        // bottleneck, and the next check comes EARLY_CHECK dispatches later.
        if enc.held > 0 {
            return Ok(out);
        }
        let full = n >= enc.batch_limit;
        let mut starving = false;
        if enc.early_submit && !full && n >= enc.early_at {
            starving = self.completed()? >= enc.enqueued;
            enc.early_at = if starving {
                (enc.early_at * 2).min(enc.batch_limit)
            } else {
                n + EARLY_CHECK
            };
        }
        if full || starving {
            if full {
                enc.early_at = EARLY_CHECK;
            }
            let batch = enc.open.take().expect("open");
            // A one-dispatch batch for a GPU that ran dry is submitted here (see
            // `INLINE_MAX`).
            // (Not while a kernel it uses still compiles: the submit thread waits for that,
            // and this one goes on recording.)
            let inline = starving && batch.dispatches <= INLINE_MAX && batch.commands.compiled();
            self.submit_counted(&mut enc, batch)?;
            if inline {
                self.drain()?;
            }
        }
        Ok(out)
    }

    /// Keeps what is recorded from now until the hold is dropped in one batch (no threshold or
    /// early submit in between; an explicit flush still submits): the two timestamps of a
    /// timed stretch of work then share a command buffer, and the host's submit latency
    /// cannot fall between them.
    pub fn hold_submits(&self) -> SubmitHold<'_> {
        self.encoder.locked().held += 1;
        SubmitHold { ctx: self }
    }

    /// Records a dispatch of `pipeline` that touches `accesses`, with a barrier before it
    /// only if it depends on (or overwrites) what earlier dispatches of the batch touch.
    pub fn dispatch(
        &self,
        pipeline: &Arc<Pipeline>,
        groups: [u32; 3],
        push_constants: &[u8],
        accesses: &[Access<'_>],
    ) -> Result<()> {
        for a in accesses {
            if !std::ptr::eq(a.buffer.core(), &self.core) {
                return Err(Error::ForeignObject {
                    what: "a dispatch's buffer",
                });
            }
            a.buffer.check_range("dispatch access", a.offset, a.len)?;
        }
        let descriptors = self.descriptors(pipeline, accesses)?;
        self.with_batch(|batch| {
            recorder::check_dispatch(&self.core, pipeline, groups, push_constants)?;
            batch.order(Stage::Compute, accesses);
            recorder::record_dispatch(
                &self.core,
                batch,
                pipeline,
                groups,
                push_constants,
                &descriptors,
            );
            if !batch.keep.iter().any(|p| Arc::ptr_eq(p, pipeline)) {
                batch.keep.push(Arc::clone(pipeline));
            }
            Ok(())
        })
    }

    /// Records a launch of `kernel` on a `grid` of blocks of `block` threads, with
    /// `shared_bytes` of dynamic shared memory and `params` by value, touching `accesses`.
    /// Ordered against earlier work exactly like `dispatch` (a barrier only on a hazard, but
    /// a full one).
    pub fn launch_native(
        &self,
        kernel: &Arc<NativeKernel>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        params: &[NativeArg],
        accesses: &[Access<'_>],
    ) -> Result<()> {
        native::check_native(&self.core, kernel, grid, block, shared_bytes, params)?;
        for a in accesses {
            if !std::ptr::eq(a.buffer.core(), &self.core) {
                return Err(Error::ForeignObject {
                    what: "a native launch's buffer",
                });
            }
            a.buffer
                .check_range("native launch access", a.offset, a.len)?;
        }
        self.with_batch(|batch| {
            batch.order(Stage::Compute, accesses);
            recorder::record_native(&self.core, batch, kernel, grid, block, shared_bytes, params);
            Ok(())
        })
    }

    /// For a pipeline that binds buffers through push descriptors: binding i is the buffer of
    /// `accesses[i]`, whole (kernels bound-check with their own sizes).
    fn descriptors(
        &self,
        pipeline: &Pipeline,
        accesses: &[Access<'_>],
    ) -> Result<Vec<vk::DescriptorBufferInfo>> {
        let n = pipeline.storage_buffers() as usize;
        if n == 0 {
            return Ok(Vec::new());
        }
        let invalid = |detail: String| Error::InvalidDispatch {
            pipeline: pipeline.name().to_owned(),
            detail,
        };
        if accesses.len() != n {
            return Err(invalid(format!(
                "binds {n} buffers but {} accesses were declared",
                accesses.len()
            )));
        }
        let max = u64::from(self.caps().limits.max_storage_buffer_range);
        accesses
            .iter()
            .map(|a| {
                let b = a.buffer;
                let range = b.class.min(b.block.size - b.offset);
                if range > max {
                    return Err(invalid(format!(
                        "a {range}-byte buffer exceeds maxStorageBufferRange ({max}); use device-address kernels"
                    )));
                }
                Ok(vk::DescriptorBufferInfo { buffer: b.raw(), offset: b.offset, range })
            })
            .collect()
    }

    /// Records a `vkCmdCopyBuffer` (for staging; device-to-device tensor copies should use a
    /// compute kernel, which is several times faster on discrete GPUs).
    pub(crate) fn record_copy(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.with_batch(|batch| {
            batch.order(
                Stage::Transfer,
                &[
                    Access::read(src).range(src_offset, len),
                    Access::write(dst).range(dst_offset, len),
                ],
            );
            let mut rec = Recorder::new(&self.core, batch);
            rec.copy_buffer(src, src_offset, dst, dst_offset, len)
        })
    }

    /// Sets every 32-bit word of `dst` (its size rounded up to 4 bytes) to `word`, in order
    /// with the work recorded before and after: a constant without a staging buffer or a
    /// copy-queue round trip (`vkCmdFillBuffer`).
    pub fn fill(&self, dst: &Buffer, word: u32) -> Result<()> {
        if !std::ptr::eq(dst.core(), &self.core) {
            return Err(Error::ForeignObject {
                what: "fill destination",
            });
        }
        // The region's size class is a multiple of 256 bytes, so the rounding stays inside it.
        let len = dst.size().next_multiple_of(4);
        if len == 0 {
            return Ok(());
        }
        self.with_batch(|batch| {
            batch.order(Stage::Transfer, &[Access::write(dst).range(0, len)]);
            batch.commands.fill(dst.raw(), dst.offset(), len, word);
            Ok(())
        })
    }

    /// Submits the open batch, if any, and every batch queued for the submit thread (on
    /// this thread, if that one has not got to them); returns the last submitted timeline
    /// value.
    pub fn flush(&self) -> Result<u64> {
        {
            let (mut enc, _g) = self.lock_encoder()?;
            // The host is about to wait: whatever is recorded next starts a new stretch of
            // work on an idle GPU, so its first dispatch is submitted at once.
            enc.early_at = 1;
            if let Some(batch) = enc.open.take() {
                self.submit_counted(&mut enc, batch)?;
            }
        }
        self.drain()?;
        Ok(self.last_submitted())
    }

    /// Waits until every recorded command (and every copy on the transfer queue) has
    /// completed.
    pub fn synchronize(&self) -> Result<()> {
        let v = self.flush()?;
        self.wait(v)?;
        if let Some(q) = &self.copy_queue {
            self.wait_copies(q.last_submitted())?;
        }
        Ok(())
    }

    /// Dispatches per submitted batch (at least 1; 1 submits every dispatch on its own).
    pub fn set_batch_limit(&self, dispatches: u32) {
        self.encoder.locked().batch_limit = dispatches.max(1);
    }

    /// Whether batches are submitted early when the GPU has run dry (default on). Off, a batch
    /// is submitted only at the dispatch threshold, a host read or `flush`: what a benchmark
    /// of pure GPU execution wants.
    pub fn set_early_submit(&self, enabled: bool) {
        self.encoder.locked().early_submit = enabled;
    }

    /// Batches, dispatches and barriers submitted so far.
    pub fn encoder_stats(&self) -> EncoderStats {
        let mut stats = self.encoder.locked().stats;
        stats.submit_ns = self.submit_ns();
        stats
    }

    pub fn batch_limit(&self) -> u32 {
        self.encoder.locked().batch_limit
    }

    /// Records with `record` into a command buffer of its own (after everything recorded
    /// before), submits, and returns the timeline value that signals completion. Commands
    /// recorded this way are fenced by full barriers before and after, since their buffer
    /// accesses are not declared.
    ///
    /// # Safety
    /// Every buffer and pipeline the recorded commands use (including buffers reached
    /// through device addresses in push constants) must stay alive until `wait(value)`
    /// returns or `completed() >= value`.
    pub unsafe fn submit<F>(&self, record: F) -> Result<u64>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<()>,
    {
        self.check_submits()?;
        let value = {
            let (mut enc, _g) = self.lock_encoder()?;
            if let Some(batch) = enc.open.take() {
                self.submit_counted(&mut enc, batch)?;
            }
            // Accesses are not declared here: wait for every copy submitted so far.
            let copies = self.copy_queue.as_ref().map_or(0, |q| q.last_submitted());
            let commands = self.spare_commands();
            let mut batch = enc.open_batch(commands, Stages::ALL, copies);
            // A failed recording is dropped unsubmitted; the next batch takes its value and
            // its external waits.
            if let Err(e) = record(&mut Recorder::new(&self.core, &mut batch)) {
                enc.external_waits.restore(batch.external_waits);
                return Err(e);
            }
            let value = batch.value;
            self.submit_counted(&mut enc, batch)?;
            value
        };
        // Submitted on return, as the name says.
        self.drain()?;
        Ok(value)
    }

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

    /// Has `timeline` reach `value` on the GPU once all work submitted so far has finished:
    /// on the compute queue, and on the transfer queue where there is one. Submits the open
    /// batch; the host does not wait. `value` must exceed every value signalled so far.
    pub fn signal_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        let t = external::own_timeline(&self.core, timeline)?;
        t.claim(value, "signal_external")?;
        self.submit_signal(Arc::clone(t), value)
    }

    /// Has every GPU command recorded after this call wait, on the GPU, until `timeline`
    /// reaches `value` (the next batch on each queue waits at all stages). Submits the open
    /// batch first, so nothing recorded before waits; the host does not wait. See the module
    /// documentation of external.rs for what this means for host waits and read-backs.
    pub fn wait_external(&self, timeline: &ExternalTimeline, value: u64) -> Result<()> {
        let t = external::own_timeline(&self.core, timeline)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemoryLocation;

    /// A batch that touches a buffer a transfer-queue copy used waits for that copy (the
    /// submit turns `wait_transfer` into a semaphore wait where the device has the queue).
    #[test]
    fn a_batch_waits_for_the_copies_of_its_buffers() {
        let ctx = Context::from_env().unwrap();
        let (a, b) = (
            ctx.create_buffer(256, MemoryLocation::DeviceLocal).unwrap(),
            ctx.create_buffer(256, MemoryLocation::DeviceLocal).unwrap(),
        );
        a.mark_transfer(7);
        b.mark_transfer(3);
        let waits = ctx
            .with_batch(|batch| {
                let before = batch.wait_transfer;
                batch.order(Stage::Compute, &[Access::read(&b)]);
                let after_b = batch.wait_transfer;
                batch.order(Stage::Compute, &[Access::read(&a)]);
                let after_a = batch.wait_transfer;
                // The copies are made up: a real submit must not wait for them.
                batch.wait_transfer = 0;
                Ok((before, after_b, after_a))
            })
            .unwrap();
        assert_eq!(waits, (0, 3, 7));
        ctx.synchronize().unwrap();
    }

    /// Barriers between commands: compute-only from dispatch to dispatch (and native
    /// launches, which are dispatches here), compute+transfer around copies, none between
    /// independent commands; the Recorder's explicit barriers are compute+transfer. Only
    /// barriers are recorded here (no command), so this runs on any device.
    #[test]
    fn barriers_are_as_narrow_as_the_hazard() {
        let ctx = Context::from_env().unwrap();
        let buf = |_| ctx.create_buffer(256, MemoryLocation::DeviceLocal).unwrap();
        let (a, b, c) = (buf(0), buf(1), buf(2));
        let kinds = ctx
            .with_batch(|batch| {
                let before = batch.commands.barrier_kinds().len();
                // Dispatch writes a → dispatch reads a: compute-only.
                batch.order(Stage::Compute, &[Access::write(&a)]);
                batch.order(Stage::Compute, &[Access::read(&a), Access::write(&b)]);
                // Independent: none.
                batch.order(Stage::Compute, &[Access::write(&c)]);
                // A copy of b: compute+transfer (a compute-only barrier came before it).
                batch.order(Stage::Transfer, &[Access::read(&b)]);
                // A dispatch writing what the copy reads: compute+transfer.
                batch.order(Stage::Compute, &[Access::write(&b)]);
                // Explicit barriers (the Recorder's): compute+transfer.
                batch.barrier();
                Ok(batch.commands.barrier_kinds()[before..].to_vec())
            })
            .unwrap();
        assert_eq!(kinds, ["compute", "full", "full", "full"]);
        ctx.synchronize().unwrap();
        let messages = ctx.validation_messages();
        assert!(messages.is_empty(), "{}", messages.join("\n"));
    }
}
