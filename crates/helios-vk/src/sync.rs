//! Locks that survive a panic elsewhere: [`LockExt::locked`], [`LockExt::into_value`] and
//! [`wait`].
//!
//! A `Mutex` is poisoned when a thread panics while holding it, and `lock` then returns an
//! error on every later call. Helios recovers the guard instead of propagating the panic:
//! a panic on one thread (a failed assertion in a test, a caller's closure) must not wedge
//! the Context for every other thread, turning each later dispatch, upload or drop into a
//! second panic. That is sound because every mutex in this crate guards state that is
//! consistent between statements: each critical section finishes its mutation before
//! anything in it can panic, or the state is plain data (counters, statistics, a list of
//! validation messages, a queue of batches) that a half-finished update leaves usable.
//! Code that adds a lock here must keep that true. The other Helios crates use these
//! helpers too, and each lock they take with them must meet the same rule.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// `lock` (and `into_inner`) that recover a poisoned mutex (see the module docs for why).
pub trait LockExt<T: ?Sized> {
    /// Locks, waiting for the current holder; a poisoned lock is used as it is.
    fn locked(&self) -> MutexGuard<'_, T>;

    /// The value, taking the mutex apart; a poisoned one's value is used as it is.
    fn into_value(self) -> T
    where
        Self: Sized,
        T: Sized;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn into_value(self) -> T
    where
        T: Sized,
    {
        self.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// `Condvar::wait` that, like [`LockExt::locked`], recovers the guard of a poisoned mutex.
pub fn wait<'a, T>(ready: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    ready.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// `Condvar::wait_timeout` that recovers the guard of a poisoned mutex, as [`wait`] does.
pub fn wait_timeout<'a, T>(
    ready: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    match ready.wait_timeout(guard, timeout) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    }
}

/// `Condvar::wait_timeout_while` that recovers the guard of a poisoned mutex, as [`wait`]
/// does: waits while `condition` holds, at most `timeout` in all.
pub fn wait_timeout_while<'a, T>(
    ready: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
    condition: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    match ready.wait_timeout_while(guard, timeout, condition) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    }
}
