//! The threads that compile deferred pipelines and native kernels
//! (`Context::create_pipeline_deferred`, `create_native_kernel_deferred`): one per host
//! thread, started on first use, taking compiles in the order they were asked for; and the
//! `Slot` a compile fills.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use crate::sync::LockExt;

type Job = Box<dyn FnOnce() + Send>;

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
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    jobs: VecDeque::new(),
    threads: 0,
});
static READY: Condvar = Condvar::new();

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
            drop(pool);
            job();
            return;
        }
    }
    READY.notify_one();
}

fn work() {
    loop {
        let job = {
            let mut pool = POOL.locked();
            loop {
                if let Some(job) = pool.jobs.pop_front() {
                    break job;
                }
                pool = crate::sync::wait(&READY, pool);
            }
        };
        job();
    }
}
