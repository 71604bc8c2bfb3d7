//! The threads that compile deferred pipelines (`Context::create_pipeline_deferred`): one per
//! host thread, started on first use, taking compiles in the order they were asked for.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use crate::sync::LockExt;

type Job = Box<dyn FnOnce() + Send>;

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
                pool = READY.wait(pool).unwrap_or_else(|e| e.into_inner());
            }
        };
        job();
    }
}
