//! The threads that compile deferred pipelines and native kernels
//! (`Context::create_pipeline_deferred`, `create_native_kernel_deferred`), and the `Slot` a
//! compile fills. Pipelines: one thread per host thread, taking compiles in the order they
//! were asked for. Native kernels: one thread of their own, taking the urgent ones (a
//! program's own launches) before the rest (tuning's candidates), because NVIDIA's driver
//! JIT-compiles one PTX module at a time per process
//! (bench/results/2026-11-30-session46-h200.md). More threads there would only take the
//! pipelines' threads and lose the order. A process about to exit calls
//! `stop_compiles`: what has not started is skipped, what runs is waited for.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use crate::sync::LockExt;

/// A compile; given `true` when the process is stopping (`stop_compiles`), it fills its
/// slot with an error instead of calling the driver.
type Job = Box<dyn FnOnce(bool) + Send>;

/// A compile's result, filled at creation or by a pool thread: `wait` blocks until it is.
pub(crate) struct Slot<T> {
    state: Mutex<Option<T>>,
    done: Condvar,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            state: Mutex::new(None),
            done: Condvar::new(),
        }
    }
}

impl<T: Copy> Slot<T> {
    pub(crate) fn set(&self, value: T) {
        *self.state.locked() = Some(value);
        self.done.notify_all();
    }

    pub(crate) fn wait(&self) -> T {
        let mut s = self.state.locked();
        loop {
            if let Some(v) = *s {
                return v;
            }
            s = crate::sync::wait(&self.done, s);
        }
    }

    pub(crate) fn ready(&self) -> bool {
        self.state.locked().is_some()
    }
}

/// Compiles waiting for a thread, taken urgent first, each kind in the order asked for.
struct Queue {
    urgent: VecDeque<Job>,
    later: VecDeque<Job>,
    threads: usize,
    /// Jobs running.
    running: usize,
    stopping: bool,
}

/// A set of compile threads: the pipelines' (one per host thread) or the native kernels'
/// lane (one thread).
struct Pool {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued.
    ready: Condvar,
    /// Signalled when nothing is queued or running.
    idle: Condvar,
    name: &'static str,
    /// Threads at most; 0: one per host thread.
    max_threads: usize,
}

static PIPELINES: Pool = Pool::new("helios-pipelines", 0);
static NATIVE: Pool = Pool::new("helios-native-jit", 1);

/// Queues `job` (a pipeline's compile) for the pipelines' threads.
pub(crate) fn spawn(job: Job) {
    PIPELINES.spawn(job, false);
}

/// Queues `job` (a native kernel's JIT) for the native lane, ahead of every job not
/// `urgent` when it is.
pub(crate) fn spawn_native(job: Job, urgent: bool) {
    NATIVE.spawn(job, urgent);
}

/// Skips the compiles and native JITs not started yet (their pipelines and kernels fail with
/// an error) and waits for those running: for a process about to exit, whose driver must not
/// be unloaded under a compile (a fresh GPT-2 run leaves dozens of tuning candidates queued,
/// each holding its Context, which the last one to finish destroys).
pub fn stop_compiles() {
    NATIVE.stop();
    PIPELINES.stop();
}

impl Pool {
    const fn new(name: &'static str, max_threads: usize) -> Pool {
        Pool {
            queue: Mutex::new(Queue {
                urgent: VecDeque::new(),
                later: VecDeque::new(),
                threads: 0,
                running: 0,
                stopping: false,
            }),
            ready: Condvar::new(),
            idle: Condvar::new(),
            name,
            max_threads,
        }
    }

    fn spawn(&'static self, job: Job, urgent: bool) {
        let mut q = self.queue.locked();
        match urgent {
            true => q.urgent.push_back(job),
            false => q.later.push_back(job),
        }
        let max = match self.max_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        if q.threads < max {
            q.threads += 1;
            let started = std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || self.work());
            if started.is_err() {
                // No thread to be had: compile here.
                q.threads -= 1;
                let job = match urgent {
                    true => q.urgent.pop_back(),
                    false => q.later.pop_back(),
                };
                let stopping = q.stopping;
                drop(q);
                job.expect("pushed above")(stopping);
                return;
            }
        }
        self.ready.notify_one();
    }

    fn work(&self) {
        loop {
            let (job, stopping) = {
                let mut q = self.queue.locked();
                loop {
                    if let Some(job) = q.urgent.pop_front().or_else(|| q.later.pop_front()) {
                        q.running += 1;
                        break (job, q.stopping);
                    }
                    q = crate::sync::wait(&self.ready, q);
                }
            };
            job(stopping);
            let mut q = self.queue.locked();
            q.running -= 1;
            if q.running == 0 && q.urgent.is_empty() && q.later.is_empty() {
                self.idle.notify_all();
            }
        }
    }

    /// `stop_compiles` for this pool: from now on every job skips; returns once none is
    /// queued or running.
    fn stop(&self) {
        let mut q = self.queue.locked();
        q.stopping = true;
        while q.running > 0 || !(q.urgent.is_empty() && q.later.is_empty()) {
            q = crate::sync::wait(&self.idle, q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    /// The native lane runs one JIT at a time, the urgent ones queued meanwhile before the
    /// others, each kind in the order asked for.
    #[test]
    fn the_native_lane_takes_urgent_jits_first() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (done_tx, done_rx) = mpsc::channel();
        let job = |name: &'static str| -> Job {
            let (order, done) = (order.clone(), done_tx.clone());
            Box::new(move |_| {
                order.locked().push(name);
                let _ = done.send(());
            })
        };
        // The first job holds the lane until the others are queued.
        let (started_tx, started_rx) = mpsc::channel();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let first = job("first");
        spawn_native(
            Box::new(move |stopping| {
                let _ = started_tx.send(());
                let _ = gate_rx.recv();
                first(stopping);
            }),
            false,
        );
        started_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the lane started the first job");
        spawn_native(job("later a"), false);
        spawn_native(job("urgent a"), true);
        spawn_native(job("later b"), false);
        spawn_native(job("urgent b"), true);
        gate_tx.send(()).expect("the first job waits");
        for _ in 0..5 {
            done_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("every job ran");
        }
        assert_eq!(
            *order.locked(),
            ["first", "urgent a", "urgent b", "later a", "later b"]
        );
    }

    /// Once the process stops the lane, the JITs not started are told to skip (their slots
    /// get an error) and the stop returns when the lane is idle. (The flag stays
    /// set: the other test's jobs ignore it.)
    #[test]
    fn stopping_skips_the_jits_not_started() {
        let (started_tx, started_rx) = mpsc::channel();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        spawn_native(
            Box::new(move |_| {
                let _ = started_tx.send(());
                let _ = gate_rx.recv();
            }),
            false,
        );
        started_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the lane started the first job");
        let (told_tx, told_rx) = mpsc::channel();
        spawn_native(
            Box::new(move |stopping| {
                let _ = told_tx.send(stopping);
            }),
            true,
        );
        // The lane only: the pipelines' pool stays open for the crate's other tests.
        let stopper = std::thread::spawn(|| NATIVE.stop());
        while !NATIVE.queue.locked().stopping {
            std::thread::sleep(Duration::from_millis(1));
        }
        gate_tx.send(()).expect("the first job waits");
        let told = told_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the queued job ran");
        assert!(told, "a JIT queued before the stop was not skipped");
        stopper.join().expect("the stop returned");
        assert_eq!(NATIVE.queue.locked().running, 0);
    }
}
