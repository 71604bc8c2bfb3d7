//! The open batch: the commands recorded since the last submit and the hazard tracking that
//! decides their barriers (`OpenBatch`), what a command declares it touches (`Access`), and
//! the encoder's state around them (`Encoder`). The Context records through these
//! (encoder.rs) and submits closed batches (submit.rs).

use std::sync::Arc;

use crate::commands::Commands;
use crate::external::{ExternalSignals, ExternalWaits, Timeline};
use crate::hazards::{Hazards, RegionKey, Touch};
use crate::memory::Buffer;
use crate::native::NativeKernel;
use crate::pipeline::Pipeline;

/// How a dispatch or copy touches a buffer.
#[derive(Clone, Copy, Debug)]
pub struct Access<'a> {
    pub buffer: &'a Buffer,
    /// Byte range inside the buffer.
    pub offset: u64,
    pub len: u64,
    pub write: bool,
}

impl<'a> Access<'a> {
    /// Reads the whole buffer.
    pub fn read(buffer: &'a Buffer) -> Self {
        Access {
            buffer,
            offset: 0,
            len: buffer.size(),
            write: false,
        }
    }

    /// Writes (and may read) the whole buffer.
    pub fn write(buffer: &'a Buffer) -> Self {
        Access {
            buffer,
            offset: 0,
            len: buffer.size(),
            write: true,
        }
    }

    /// The same access narrowed to `[offset, offset + len)` of the buffer.
    pub fn range(self, offset: u64, len: u64) -> Self {
        Access {
            offset,
            len,
            ..self
        }
    }
}

impl Touch for Access<'_> {
    /// The region key and absolute byte range in the block.
    fn span(&self) -> (RegionKey, u64, u64) {
        let b = self.buffer;
        let start = b.offset + self.offset;
        (b.hazard_key(), start, start + self.len)
    }

    fn writes(&self) -> bool {
        self.write
    }
}

/// Default dispatches per submitted batch (`HELIOS_BATCH` overrides).
pub const DEFAULT_BATCH: u32 = 256;

/// The batch being recorded.
pub(crate) struct OpenBatch {
    /// Its commands, recorded into a command buffer when it is submitted.
    pub(crate) commands: Commands,
    /// The timeline value this batch will signal.
    pub(crate) value: u64,
    pub(crate) dispatches: u32,
    /// Barriers inserted for hazards (or asked for through a Recorder).
    barriers: u32,
    hazards: Hazards,
    /// Stages of the commands since the last barrier.
    stages: Stages,
    /// Whether a dispatch was recorded since the last compute+transfer barrier.
    compute_since_full: bool,
    /// Transfer-timeline value the batch must wait for (0: none).
    pub(crate) wait_transfer: u64,
    /// Pipelines the batch uses, kept alive until it completes.
    pub(crate) keep: Vec<Arc<Pipeline>>,
    /// Native kernels the batch launches, kept alive until it completes.
    pub(crate) keep_native: Vec<Arc<NativeKernel>>,
    /// External timeline values the batch waits for before any of its commands
    /// (`Context::wait_external`).
    pub(crate) external_waits: ExternalWaits,
    /// External timeline values signalled once the batch and everything before it on the
    /// queue are done (`Context::signal_external`).
    pub(crate) external_signals: ExternalSignals,
}

impl OpenBatch {
    /// Inserts a barrier if `accesses` (made by a command of `stage`) conflict with earlier
    /// ones, then records them.
    pub(crate) fn order(&mut self, stage: Stage, accesses: &[Access<'_>]) {
        if stage == Stage::Transfer && self.compute_since_full {
            // Compute-only barriers since the last full one do not order earlier dispatches
            // before a copy; copies are rare inside a batch, so fence everything.
            self.barrier_from(Stages::ALL, stage);
        } else if self.hazards.conflicts(accesses) | self.first_use_of_remapped(accesses) {
            self.barrier_from(self.stages, stage);
        }
        if stage == Stage::Compute {
            self.compute_since_full = true;
        }
        self.hazards.add(accesses);
        self.stages.insert(stage);
        for a in accesses {
            a.buffer.mark(self.value, a.write);
            // A copy on the transfer queue that wrote (or reads) this buffer runs beside the
            // compute queue: the batch waits for it (copy_queue.rs).
            self.wait_transfer = self.wait_transfer.max(a.buffer.transfer_use());
        }
    }

    /// Whether an access is the first use of a remapped region (see `Buffer::take_remapped`)
    /// whose old extents earlier commands of this batch may still touch. Uses in earlier
    /// batches are ordered by the barrier each batch begins with.
    fn first_use_of_remapped(&self, accesses: &[Access<'_>]) -> bool {
        let mut any = false;
        for a in accesses {
            // Every flag is taken: one barrier fences them all. `last_use` is still the
            // region's previous occupants' (marked after this check).
            any |= a.buffer.take_remapped() && a.buffer.last_use() >= self.value;
        }
        any && self.stages != Stages::NONE
    }

    /// A full compute/transfer barrier; forgets the tracked accesses.
    pub(crate) fn barrier(&mut self) {
        self.barrier_from(Stages::ALL, Stage::Compute);
    }

    /// A barrier from the stages used since the last one to `next`. Between dispatches this
    /// is compute→compute only: a transfer stage in the mask costs NVIDIA more. Native
    /// launches are dispatches here (native.rs).
    fn barrier_from(&mut self, used: Stages, next: Stage) {
        if used == Stages::COMPUTE && next == Stage::Compute {
            self.commands.compute_barrier();
        } else {
            self.commands.full_barrier();
            self.compute_since_full = false;
        }
        self.hazards.clear();
        self.stages = Stages::NONE;
        self.barriers += 1;
    }
}

/// The pipeline stage of a recorded command: a dispatch or native launch, or a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Compute,
    Transfer,
}

/// A set of stages (bit 0 compute, bit 1 transfer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stages(u8);

impl Stages {
    pub(crate) const NONE: Stages = Stages(0);
    const COMPUTE: Stages = Stages(1);
    /// What a fresh command buffer may follow: anything (batch boundaries fence both).
    pub(crate) const ALL: Stages = Stages(3);

    fn insert(&mut self, s: Stage) {
        self.0 |= match s {
            Stage::Compute => 1,
            Stage::Transfer => 2,
        };
    }
}

pub(crate) struct Encoder {
    pub(crate) open: Option<OpenBatch>,
    pub(crate) batch_limit: u32,
    /// Dispatches into a batch before the next early-submit check (see `with_batch`).
    pub(crate) early_at: u32,
    /// Whether batches may be submitted before the threshold when the GPU idles.
    pub(crate) early_submit: bool,
    /// Open `SubmitHold`s: while any is, the open batch is submitted only by a flush.
    pub(crate) held: u32,
    /// The timeline value of the last batch handed over for submission (the open batch
    /// signals the next one).
    pub(crate) enqueued: u64,
    /// External waits for the next batch to open (`Context::wait_external`).
    pub(crate) external_waits: ExternalWaits,
    /// Totals over submitted batches.
    pub(crate) stats: EncoderStats,
}

/// What the encoder has submitted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EncoderStats {
    pub batches: u64,
    pub dispatches: u64,
    /// Barriers between dispatches (the ones at batch boundaries are not counted).
    pub barriers: u64,
    /// Host time spent opening batches (a free command buffer may mean a wait) and submitting
    /// them (ending, queue submit, and any wait for too many batches in flight), ns.
    pub submit_ns: u64,
}

impl Encoder {
    pub(crate) fn new(batch_limit: u32) -> Self {
        Encoder {
            open: None,
            batch_limit,
            early_at: 1,
            early_submit: true,
            held: 0,
            enqueued: 0,
            external_waits: ExternalWaits::default(),
            stats: EncoderStats::default(),
        }
    }

    /// Has the next batch to open wait for `timeline` to reach `value` (external.rs).
    pub(crate) fn wait_next(&mut self, timeline: &Arc<Timeline>, value: u64) {
        self.external_waits.add(timeline, value);
    }

    /// A new batch, signalling the next timeline value, that takes the pending external
    /// waits.
    pub(crate) fn open_batch(
        &mut self,
        commands: Commands,
        stages: Stages,
        wait_transfer: u64,
    ) -> OpenBatch {
        let mut batch = OpenBatch::new(commands, self.enqueued + 1, stages, wait_transfer);
        batch.external_waits = self.external_waits.take();
        batch
    }

    /// Counts a batch about to be submitted.
    pub(crate) fn count(&mut self, batch: &OpenBatch) {
        self.stats.batches += 1;
        self.stats.dispatches += u64::from(batch.dispatches);
        self.stats.barriers += u64::from(batch.barriers);
    }
}

impl OpenBatch {
    fn new(commands: Commands, value: u64, stages: Stages, wait_transfer: u64) -> OpenBatch {
        OpenBatch {
            commands,
            value,
            dispatches: 0,
            barriers: 0,
            hazards: Hazards::default(),
            stages,
            compute_since_full: false,
            wait_transfer,
            keep: Vec::new(),
            keep_native: Vec::new(),
            external_waits: ExternalWaits::default(),
            external_signals: Vec::new(),
        }
    }
}
