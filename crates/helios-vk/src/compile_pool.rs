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

struct Pool {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Jobs running.
    running: usize,
    stopping: bool,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    jobs: VecDeque::new(),
    threads: 0,
    running: 0,
    stopping: false,
});
static READY: Condvar = Condvar::new();
static IDLE: Condvar = Condvar::new();

/// Queues `job` (a pipeline's compile) for the pool.
pub(crate) fn spawn(job: Job) {
    let mut pool = POOL.locked();
    pool.jobs.push_back(job);
    let want = std::thread::available_parallelism().map_or(1, |n| n.get());
    if pool.threads < want {
        pool.threads += 1;
        let started = std::thread::Builder::new()
            .name("helios-pipelines".into())
            .spawn(work);
        if started.is_err() {
            // No thread to be had: compile here.
            pool.threads -= 1;
            let job = pool.jobs.pop_back().expect("pushed above");
            let stopping = pool.stopping;
            drop(pool);
            job(stopping);
            return;
        }
    }
    READY.notify_one();
}

fn work() {
    loop {
        let (job, stopping) = {
            let mut pool = POOL.locked();
            loop {
                if let Some(job) = pool.jobs.pop_front() {
                    pool.running += 1;
                    break (job, pool.stopping);
                }
                pool = crate::sync::wait(&READY, pool);
            }
        };
        job(stopping);
        let mut pool = POOL.locked();
        pool.running -= 1;
        if pool.running == 0 && pool.jobs.is_empty() {
            IDLE.notify_all();
        }
    }
}

/// The native kernels' lane: urgent JITs first, each kind in the order asked for.
struct Lane {
    urgent: VecDeque<Job>,
    later: VecDeque<Job>,
    started: bool,
    /// A job is running.
    busy: bool,
    stopping: bool,
}

static LANE: Mutex<Lane> = Mutex::new(Lane {
    urgent: VecDeque::new(),
    later: VecDeque::new(),
    started: false,
    busy: false,
    stopping: false,
});
static LANE_READY: Condvar = Condvar::new();
static LANE_IDLE: Condvar = Condvar::new();

/// Queues `job` (a native kernel's JIT) for the native lane, ahead of every job not
/// `urgent` when it is.
pub(crate) fn spawn_native(job: Job, urgent: bool) {
    let mut lane = LANE.locked();
    match urgent {
        true => lane.urgent.push_back(job),
        false => lane.later.push_back(job),
    }
    if !lane.started {
        let started = std::thread::Builder::new()
            .name("helios-native-jit".into())
            .spawn(work_native);
        if started.is_err() {
            // No thread to be had: compile here.
            let job = match urgent {
                true => lane.urgent.pop_back(),
                false => lane.later.pop_back(),
            };
            let stopping = lane.stopping;
            drop(lane);
            job.expect("pushed above")(stopping);
            return;
        }
        lane.started = true;
    }
    LANE_READY.notify_one();
}

fn work_native() {
    loop {
        let (job, stopping) = {
            let mut lane = LANE.locked();
            loop {
                if let Some(job) = lane.urgent.pop_front().or_else(|| lane.later.pop_front()) {
                    lane.busy = true;
                    break (job, lane.stopping);
                }
                lane = crate::sync::wait(&LANE_READY, lane);
            }
        };
        job(stopping);
        let mut lane = LANE.locked();
        lane.busy = false;
        if lane.urgent.is_empty() && lane.later.is_empty() {
            LANE_IDLE.notify_all();
        }
    }
}

/// Skips the compiles and native JITs not started yet (their pipelines and kernels fail with
/// an error) and waits for those running: for a process about to exit, whose driver must not
/// be unloaded under a compile (a fresh GPT-2 run leaves dozens of tuning candidates queued,
/// each holding its Context, which the last one to finish destroys).
pub fn stop_compiles() {
    stop_lane();
    let mut pool = POOL.locked();
    pool.stopping = true;
    while pool.running > 0 || !pool.jobs.is_empty() {
        pool = crate::sync::wait(&IDLE, pool);
    }
}

/// The native lane's part of `stop_compiles`.
fn stop_lane() {
    let mut lane = LANE.locked();
    lane.stopping = true;
    while lane.busy || !(lane.urgent.is_empty() && lane.later.is_empty()) {
        lane = crate::sync::wait(&LANE_IDLE, lane);
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
        // The lane only: the pool stays open for the crate's other tests.
        let stopper = std::thread::spawn(stop_lane);
        while !LANE.locked().stopping {
            std::thread::sleep(Duration::from_millis(1));
        }
        gate_tx.send(()).expect("the first job waits");
        let told = told_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the queued job ran");
        assert!(told, "a JIT queued before the stop was not skipped");
        stopper.join().expect("stop_lane returned");
        assert!(!LANE.locked().busy);
    }
}
