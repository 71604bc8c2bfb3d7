//! The scheduler's one lock, and cells that only its holder can reach.
//!
//! Every realisation runs under one process-wide lock (`lock`): the scheduler decides from
//! reference counts, which another thread realising the same nodes would change under it.
//! A pending node's op is read and written only there (and through `&mut` on the node), so
//! a mutex per node would only add two locked instructions per op to a chain's realisation
//! (~5 ns each, a large share of it). The design decision a reader must know: `Realizing`,
//! the proof that this thread holds the lock, is the only way into a `RealizeCell`.
//!
//! Also the crate's one way to take a lock (`LockExt`), which recovers a poisoned one.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

/// Proof that this thread holds the scheduler's lock. Exactly one exists, inside `REALIZE`
/// (the field is private to this module), and it is not `Sync`: a `&Realizing` is only ever
/// on the thread holding the lock, and only while it holds it.
pub(crate) struct Realizing(PhantomData<Cell<()>>);

static REALIZE: Mutex<Realizing> = Mutex::new(Realizing(PhantomData));

/// Takes the scheduler's lock (waiting for another thread's realisation to finish).
///
/// The lock is not re-entrant: work done under it (a product's recording, a reduction's
/// prologue) must not realise a node. Builds with debug assertions catch a thread asking
/// again, which would otherwise wait for itself forever.
pub(crate) fn lock() -> Held {
    #[cfg(debug_assertions)]
    HELD.with(|held| {
        assert!(
            !held.replace(true),
            "a realisation asked for the scheduler's lock it holds (a bug)"
        )
    });
    Held(REALIZE.locked())
}

#[cfg(debug_assertions)]
thread_local! {
    /// Whether this thread holds the scheduler's lock.
    static HELD: Cell<bool> = const { Cell::new(false) };
}

/// The scheduler's lock, held (see `lock`).
pub(crate) struct Held(MutexGuard<'static, Realizing>);

impl std::ops::Deref for Held {
    type Target = Realizing;

    fn deref(&self) -> &Realizing {
        &self.0
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        let _ = HELD.try_with(|held| held.set(false));
    }
}

/// `lock` (and `into_inner`) that recover a poisoned mutex instead of panicking
/// (`helios_vk::sync`).
///
/// A panic on one thread (a failed assertion in a test, a caller's closure, a kernel that
/// failed to build) must not wedge the engine: with `unwrap`, every later op on any thread
/// would panic on the same lock. Using the data is sound because each of this crate's
/// mutexes guards values that are valid in every state a panic can leave: caches and memos
/// (compiled kernels, tuning winners) gain or replace whole entries, a gradient or
/// activation slot is replaced whole, the live-node counts are plain numbers, and the
/// scheduler's lock guards no data of its own (`Realizing` is a zero-sized proof).
pub(crate) use helios_vk::sync::LockExt;

/// A value shared between threads that only the holder of the scheduler's lock reads or
/// writes (or whoever has the cell by `&mut`). It moves values in and out and never lends a
/// reference to its content, like `Cell`.
pub(crate) struct RealizeCell<T>(Cell<T>);

// SAFETY: `Cell<T>` is not `Sync` only because two threads could touch it at once. Here every
// access through `&self` takes a `&Realizing`, which exists only on the one thread that holds
// `REALIZE` (see `Realizing`), so accesses are serialised by that mutex, which also orders
// them across threads; access through `&mut self` is exclusive anyway. `T: Send`: the value
// is moved in on one thread and out on another, as through a `Mutex<T>`.
unsafe impl<T: Send> Sync for RealizeCell<T> {}

impl<T> RealizeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        RealizeCell(Cell::new(value))
    }

    /// Replaces the value, returning the old one.
    pub(crate) fn replace(&self, value: T, _lock: &Realizing) -> T {
        self.0.replace(value)
    }

    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }
}

impl<T: Default> RealizeCell<T> {
    /// Takes the value, leaving the default.
    pub(crate) fn take(&self, lock: &Realizing) -> T {
        self.replace(T::default(), lock)
    }
}
