//! A deadline on every collective call: a rank whose peers stopped without failing (a
//! deadlock, a rank that took another path, a stopped machine) would otherwise wait in MPI
//! or NCCL for ever. One watchdog thread per process watches the call in progress, and
//! stops the run when one outlasts the deadline (`HELIOS_DIST_TIMEOUT`, as for joining).
//!
//! What it cannot see: NCCL's all-reduce is only enqueued by the call, so a hang there
//! shows in the device's wait afterwards, not here.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use helios::Tensor;
use helios_vk::sync::{wait, wait_timeout, LockExt};

use crate::{Collective, Rank, Result, Shards};

/// What to do when a call outlasts the deadline: given the operation's name.
type Expiry = Box<dyn FnOnce(&'static str) + Send>;

/// The call in progress and whether the watchdog should stop.
#[derive(Default)]
struct Slot {
    call: Option<(&'static str, Instant)>,
    closed: bool,
}

/// `inner` with a deadline on each collective call.
pub(crate) struct Guarded {
    inner: Box<dyn Collective>,
    timeout: Duration,
    slot: Arc<(Mutex<Slot>, Condvar)>,
}

impl Guarded {
    /// Guards `inner`'s calls with `timeout`; `expired` runs (on the watchdog's thread) if
    /// one outlasts it.
    pub(crate) fn new(
        inner: Box<dyn Collective>,
        timeout: Duration,
        expired: impl FnOnce(&'static str) + Send + 'static,
    ) -> Guarded {
        let slot = Arc::new((Mutex::new(Slot::default()), Condvar::new()));
        let watched = slot.clone();
        let expired: Expiry = Box::new(expired);
        std::thread::spawn(move || watch(&watched, expired));
        Guarded {
            inner,
            timeout,
            slot,
        }
    }

    /// Runs `f` on the inner collective as operation `op`, under the deadline.
    fn timed<T>(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut dyn Collective) -> Result<T>,
    ) -> Result<T> {
        self.set(Some((op, Instant::now() + self.timeout)));
        let out = f(&mut *self.inner);
        self.set(None);
        out
    }

    fn set(&self, call: Option<(&'static str, Instant)>) {
        let (lock, cv) = &*self.slot;
        lock.locked().call = call;
        cv.notify_all();
    }
}

/// The watchdog's loop: sleeps until the call in progress is due, runs `expired` once if
/// it still is then, and ends when the collective is dropped.
fn watch(slot: &(Mutex<Slot>, Condvar), expired: Expiry) {
    let (lock, cv) = slot;
    let mut s = lock.locked();
    loop {
        if s.closed {
            return;
        }
        match s.call {
            None => s = wait(cv, s),
            Some((op, due)) => {
                let now = Instant::now();
                if now >= due {
                    drop(s);
                    expired(op);
                    return;
                }
                s = wait_timeout(cv, s, due - now);
            }
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let (lock, cv) = &*self.slot;
        lock.locked().closed = true;
        cv.notify_all();
    }
}

impl Collective for Guarded {
    fn rank(&self) -> Rank {
        self.inner.rank()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn broadcast_from(&mut self, root: usize, bytes: &mut [u8]) -> Result<()> {
        self.timed("broadcast", |c| c.broadcast_from(root, bytes))
    }

    fn mean(&mut self, values: &mut [f64]) -> Result<()> {
        self.timed("mean", |c| c.mean(values))
    }

    fn sum_f32(&mut self, values: &Tensor) -> Result<Tensor> {
        self.timed("sum", |c| c.sum_f32(values))
    }

    fn sum_gradients(&mut self, tensors: &[Tensor], loss: &Tensor) -> Result<Tensor> {
        self.timed("gradient sum", |c| c.sum_gradients(tensors, loss))
    }

    fn reduce_gradients(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        self.timed("gradient reduce", |c| c.reduce_gradients(tensors, shards))
    }

    fn broadcast_owned(&mut self, tensors: &[Tensor], shards: &Shards) -> Result<()> {
        self.timed("parameter broadcast", |c| {
            c.broadcast_owned(tensors, shards)
        })
    }

    fn finish(&mut self) -> Result<()> {
        self.timed("finish", |c| c.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A collective whose `mean` waits until `release` is set (a peer that never comes).
    struct Stuck {
        release: Arc<AtomicBool>,
    }

    impl Collective for Stuck {
        fn rank(&self) -> Rank {
            crate::Single.rank()
        }
        fn backend(&self) -> &'static str {
            "stuck"
        }
        fn broadcast_from(&mut self, _: usize, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
        fn mean(&mut self, _: &mut [f64]) -> Result<()> {
            while !self.release.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        }
        fn sum_gradients(&mut self, _: &[Tensor], loss: &Tensor) -> Result<Tensor> {
            Ok(loss.clone())
        }
        fn reduce_gradients(&mut self, _: &[Tensor], _: &Shards) -> Result<()> {
            Ok(())
        }
        fn broadcast_owned(&mut self, _: &[Tensor], _: &Shards) -> Result<()> {
            Ok(())
        }
    }

    /// A call that outlasts the deadline sets off the expiry with its name (which here
    /// releases it instead of stopping the process); calls that return in time do not.
    #[test]
    fn a_stuck_call_expires_and_quick_ones_do_not() {
        let release = Arc::new(AtomicBool::new(false));
        let named = Arc::new(Mutex::new(None));
        let (r, n) = (release.clone(), named.clone());
        let mut g = Guarded::new(
            Box::new(Stuck { release }),
            Duration::from_millis(100),
            move |op| {
                *n.lock().unwrap() = Some(op);
                r.store(true, Ordering::SeqCst);
            },
        );
        // Quick calls, longer in all than the deadline: no expiry.
        for _ in 0..30 {
            g.broadcast(&mut [0u8; 4]).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*named.lock().unwrap(), None);
        let started = Instant::now();
        g.mean(&mut [1.0]).unwrap();
        assert_eq!(*named.lock().unwrap(), Some("mean"));
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    /// Dropping the collective ends the watchdog without an expiry.
    #[test]
    fn dropping_ends_the_watch() {
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let g = Guarded::new(
            Box::new(Stuck {
                release: Arc::new(AtomicBool::new(true)),
            }),
            Duration::from_millis(20),
            move |_| f.store(true, Ordering::SeqCst),
        );
        drop(g);
        std::thread::sleep(Duration::from_millis(60));
        assert!(!fired.load(Ordering::SeqCst));
    }
}
