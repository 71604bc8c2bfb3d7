//! The submit thread: closed batches are recorded into command buffers and submitted off the
//! thread that records them.
//!
//! On NVIDIA, the driver's work per command (vkCmdDispatch, vkCmdPushConstants, barriers) and
//! per submit is a large share of the host time of a small model's training step (perf;
//! bench/results/source-comment-history.md). The encoder therefore only lists a batch's
//! commands (commands.rs); when the batch closes it is queued here, and one thread per
//! Context replays the list into a command buffer and submits it while the recording thread
//! goes on.
//!
//! The decisions a reader must know:
//! - Batches are submitted in order, whoever submits them: taking a batch off the queue and
//!   submitting it happen under one lock (`running`). A thread that must see its work
//!   submitted (a host wait, `flush`, an explicit `submit`), or that closes a short batch
//!   for a GPU that ran dry (encoder.rs), submits what is still queued itself (`drain`)
//!   instead of waiting for the submit thread to wake. (A submit thread that polled the
//!   queue for a millisecond before sleeping measured no better on the H100 host.)
//! - A queued batch holds an `Arc` of its Context, so the Context outlives its queued work
//!   and its Drop never finds work queued. The thread itself holds only the queue, so a
//!   Context whose last `Arc` is a batch's is dropped on the submit thread, which then ends.
//! - A batch that fails to submit is fatal for the Context: its timeline value never
//!   arrives, and later values would claim work that never ran. Every later batch is dropped
//!   and every later call that submits or waits returns the first failure.

use crate::sync::{wait, LockExt};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use ash::vk;

use crate::error::{Error, Result};

/// What the submit thread submits batches to: the Context (submit.rs).
pub(crate) trait Submits: Send + Sync + 'static {
    type Batch: Send;

    /// Records `batch` into a command buffer and submits it.
    fn submit_batch(&self, batch: Self::Batch) -> Result<()>;
}

/// Batches queued for submission, shared by a Context and its submit thread.
pub(crate) struct Jobs<C: Submits> {
    state: Mutex<State<C>>,
    /// Signalled when a batch is queued or the queue closes.
    ready: Condvar,
    /// Held while a batch is taken off the queue and submitted: submission order is queue
    /// order.
    running: Mutex<()>,
    /// The first submission failure (the call and its result).
    failure: Mutex<Option<(&'static str, vk::Result)>>,
    failed: AtomicBool,
    /// Host time spent recording command buffers and submitting them, ns.
    submit_ns: AtomicU64,
}

struct State<C: Submits> {
    queue: VecDeque<Job<C>>,
    closed: bool,
}

struct Job<C: Submits> {
    ctx: Arc<C>,
    batch: C::Batch,
}

impl<C: Submits> Jobs<C> {
    pub(crate) fn new() -> Arc<Jobs<C>> {
        Arc::new(Jobs {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            running: Mutex::new(()),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            submit_ns: AtomicU64::new(0),
        })
    }

    /// Starts the submit thread; `None` if the system refused a thread (batches are then
    /// submitted where they close).
    pub(crate) fn spawn(self: &Arc<Self>) -> Option<JoinHandle<()>> {
        let jobs = Arc::clone(self);
        std::thread::Builder::new()
            .name("helios-submit".into())
            .spawn(move || jobs.serve())
            .ok()
    }

    fn serve(&self) {
        loop {
            {
                let mut s = self.state.locked();
                while s.queue.is_empty() {
                    if s.closed {
                        return;
                    }
                    s = wait(&self.ready, s);
                }
            }
            self.run_next();
        }
    }

    /// Queues `batch` of `ctx` and, where a submit thread serves the queue (`notify`), wakes it.
    pub(crate) fn push(&self, ctx: Arc<C>, batch: C::Batch, notify: bool) {
        self.state.locked().queue.push_back(Job { ctx, batch });
        if notify {
            self.ready.notify_one();
        }
    }

    /// Submits the oldest queued batch, if any; false if the queue was empty.
    pub(crate) fn run_next(&self) -> bool {
        let ctx = {
            let _running = self.running.locked();
            let Some(Job { ctx, batch }) = self.state.locked().queue.pop_front() else {
                return false;
            };
            if !self.failed.load(Ordering::Acquire) {
                let t = Instant::now();
                if let Err(e) = ctx.submit_batch(batch) {
                    self.fail(e);
                }
                let ns = t.elapsed().as_nanos() as u64;
                self.submit_ns.fetch_add(ns, Ordering::Relaxed);
            }
            ctx
        };
        // Possibly the Context's last handle: dropped with no lock held.
        drop(ctx);
        true
    }

    fn fail(&self, e: Error) {
        let mut f = self.failure.locked();
        if f.is_none() {
            *f = Some(match e {
                Error::Vk { call, result } => (call, result),
                Error::DeviceLost => ("vkQueueSubmit", vk::Result::ERROR_DEVICE_LOST),
                _ => ("vkQueueSubmit", vk::Result::ERROR_UNKNOWN),
            });
        }
        self.failed.store(true, Ordering::Release);
    }

    /// The first failed submission, if there was one: nothing submits after it.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match *self.failure.locked() {
            Some((call, result)) => Err(Error::vk(call, result)),
            None => Err(Error::DeviceLost),
        }
    }

    /// Host time spent recording and submitting batches so far, ns.
    pub(crate) fn submit_ns(&self) -> u64 {
        self.submit_ns.load(Ordering::Relaxed)
    }

    /// Closes the queue: the submit thread ends once it is empty.
    pub(crate) fn close(&self) {
        self.state.locked().closed = true;
        self.ready.notify_all();
    }
}
