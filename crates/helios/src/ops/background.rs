//! The background compiles of tuning on real work (matmul's `explore` and attention's):
//! candidates' kernels generated and asked for by a pool of threads while the program runs
//! its first choices, each thread waiting for its kernel before taking the next (the driver's
//! compile itself runs on helios-vk's compile pool, beside the program's own deferred
//! compiles).
//!
//! The decisions a reader must know: kernels are taken round robin across the classes that
//! asked (each class's in the order it gave, likelier winners first), so every class gets its
//! first candidates early instead of waiting behind another class's whole list; at most
//! one candidate per thread is in flight, and the threads are a quarter of the host's, so
//! the program's own compiles never queue behind the thousand or so a fresh GPT-2 run asks
//! for, nor wait for the driver beside a dozen of them; and the program's thread never
//! generates a candidate's code (an attention kernel takes ~8 ms to generate: a fresh GPT-2
//! run's second step spent ~0.2 s on them, bench/results/2026-11-30-session48-h200.md).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use helios_kernels::{AttentionKernel, MatmulKernel};

use crate::device::KernelKey;
use crate::realize_lock::LockExt;
use crate::Device;

/// A candidate kernel of either tuner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Candidate {
    Matmul(MatmulKernel),
    Attention(AttentionKernel),
}

struct Queue {
    /// One entry per request, served round robin.
    classes: VecDeque<(Device, VecDeque<Candidate>)>,
    /// (device, kernel) queued or compiling.
    queued: HashSet<(usize, Candidate)>,
    failed: HashSet<(usize, Candidate)>,
    /// Kernels queued or compiling.
    busy: usize,
    workers: usize,
}

fn queue() -> &'static Mutex<Queue> {
    static QUEUE: std::sync::OnceLock<Mutex<Queue>> = std::sync::OnceLock::new();
    QUEUE.get_or_init(|| {
        Mutex::new(Queue {
            classes: VecDeque::new(),
            queued: HashSet::new(),
            failed: HashSet::new(),
            busy: 0,
            workers: 0,
        })
    })
}

static WORK: Condvar = Condvar::new();
/// Background compiles finished so far, failed ones included (`generation`).
static FINISHED: AtomicU64 = AtomicU64::new(0);
static IDLE: Condvar = Condvar::new();
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Queues matmul `kernels` of one class for compiling (`compile_candidates`).
pub(crate) fn compile(device: &Device, kernels: Vec<MatmulKernel>) {
    compile_candidates(device, kernels.into_iter().map(Candidate::Matmul).collect())
}

/// Queues `kernels` of one class for compiling (those compiled, queued or failed already are
/// skipped).
pub(crate) fn compile_candidates(device: &Device, kernels: Vec<Candidate>) {
    let mut q = queue().locked();
    let fresh: VecDeque<Candidate> = kernels
        .into_iter()
        .filter(|k| {
            let id = (device.id(), *k);
            !q.failed.contains(&id) && !device.has_kernel(&k.key()) && q.queued.insert(id)
        })
        .collect();
    if fresh.is_empty() {
        return;
    }
    q.busy += fresh.len();
    q.classes.push_back((device.clone(), fresh));
    // A quarter of the host's threads: with all but one, a cold GPT-2 step waited for its own
    // pipelines behind the candidates' compiles (first step 1.7-2.7 s against 0.9 on an H200,
    // bench/results/2026-11-30-session49-h200.md).
    let want = std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1));
    while q.workers < want {
        q.workers += 1;
        std::thread::Builder::new()
            .name("helios-tune".into())
            .spawn(work)
            .expect("a thread for background compiles");
    }
    WORK.notify_all();
}

/// Whether matmul kernel `k` failed to compile on `device`.
pub(crate) fn failed(device: &Device, k: &MatmulKernel) -> bool {
    queue()
        .locked()
        .failed
        .contains(&(device.id(), Candidate::Matmul(*k)))
}

fn work() {
    loop {
        let (device, k) = {
            let mut q = queue().locked();
            loop {
                if let Some((device, mut kernels)) = q.classes.pop_front() {
                    let k = kernels.pop_front().expect("classes hold kernels");
                    if !kernels.is_empty() {
                        q.classes.push_back((device.clone(), kernels));
                    }
                    break (device, k);
                }
                q = helios_vk::sync::wait(&WORK, q);
            }
        };
        let ok = STOPPING.load(Ordering::Acquire) || build(&device, k).is_ok();
        let id = device.id();
        // The last holder of a device tears it down: before the compile counts as finished,
        // so that a process leaving `stop` never exits under the teardown (a fresh GPT-2
        // run's `helios train` ended in a segmentation fault, session 50).
        drop(device);
        let mut q = queue().locked();
        q.queued.remove(&(id, k));
        if !ok {
            q.failed.insert((id, k));
        }
        q.busy -= 1;
        FINISHED.fetch_add(1, Ordering::Release);
        IDLE.notify_all();
    }
}

fn build(device: &Device, k: Candidate) -> crate::Result<()> {
    match k {
        Candidate::Matmul(k) if k.variant.is_native() => {
            let target = device.native_target().ok_or(crate::Error::Invalid {
                op: "matmul",
                detail: "a native kernel on a device without them".into(),
            })?;
            device
                .native_kernel(KernelKey::Matmul(k), || Ok(k.build_native(target)?), false)?
                .wait()?;
        }
        // The pipeline compiles on the pool; a candidate is ready once it has.
        Candidate::Matmul(k) => device
            .kernel(KernelKey::Matmul(k), || k.build())?
            .pipeline
            .wait()?,
        Candidate::Attention(k) => crate::ops::attention::tune::compile_and_wait(device, k)?,
    }
    Ok(())
}

impl Candidate {
    fn key(&self) -> KernelKey {
        match *self {
            Candidate::Matmul(k) => KernelKey::Matmul(k),
            Candidate::Attention(k) => KernelKey::Attention(k),
        }
    }
}

/// How many background compiles have finished: a kernel found not compiled cannot have
/// become so (through these threads) while this stays the same.
pub(crate) fn generation() -> u64 {
    FINISHED.load(Ordering::Acquire)
}

/// Waits until every queued background compile has finished.
pub(crate) fn wait_idle() {
    let mut q = queue().locked();
    while q.busy > 0 {
        q = helios_vk::sync::wait(&IDLE, q);
    }
}

/// Skips the compiles not started yet and waits for those running, tuning's and those
/// queued for anything else (attention's candidates): for a process about to exit (a driver
/// unloaded under a compiling thread may crash).
pub fn stop() {
    STOPPING.store(true, Ordering::Release);
    helios_vk::stop_compiles();
    wait_idle();
}
