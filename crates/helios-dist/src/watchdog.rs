//! A deadline for joining the other ranks: a rank whose peers never come (one crashed
//! before it connected, a wrong `NCCL_COMM_ID`) would otherwise wait in NCCL's or MPI's
//! initialisation for ever.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use helios_vk::sync::{wait_timeout_while, LockExt};

/// How long a rank waits for the others to join, or in a collective call
/// (`HELIOS_DIST_TIMEOUT`, seconds).
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs `expired` on its own thread unless disarmed (or dropped) within `timeout`.
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    pub fn arm(timeout: Duration, expired: impl FnOnce() + Send + 'static) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let watched = done.clone();
        std::thread::spawn(move || {
            let (lock, cv) = &*watched;
            let guard = wait_timeout_while(cv, lock.locked(), timeout, |done| !*done);
            if !*guard {
                drop(guard);
                expired();
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.done;
        *lock.locked() = true;
        cv.notify_all();
    }
}

/// `JOIN_TIMEOUT`, or `HELIOS_DIST_TIMEOUT` seconds when set.
pub fn join_timeout() -> crate::Result<Duration> {
    Ok(crate::env::dist_timeout()?.unwrap_or(JOIN_TIMEOUT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn fires_only_when_not_disarmed_in_time() {
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let dog = Watchdog::arm(Duration::from_millis(50), move || {
            f.store(true, Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(fired.load(Ordering::SeqCst), "not disarmed: it fires");
        drop(dog);

        let calm = Arc::new(AtomicBool::new(false));
        let c = calm.clone();
        let dog = Watchdog::arm(Duration::from_millis(200), move || {
            c.store(true, Ordering::SeqCst)
        });
        drop(dog);
        std::thread::sleep(Duration::from_millis(400));
        assert!(
            !calm.load(Ordering::SeqCst),
            "disarmed in time: it stays quiet"
        );
    }
}
