//! What the scheduler keeps from one realisation to the next for its allocations: spare
//! nodes (`Spare`), this thread's pending list beside them, the per-thread live-node
//! counters, and the scratch lists of `collect` and `lower` (`Scratch`).
//!
//! The design decision a reader must know: all of it is per thread. A node built from a
//! spare and counted on this thread's counter costs no malloc and no locked update of a
//! shared counter; a chain of 1000 ops otherwise pays 1000 of each, most of building a node.
//! The helpers called once per node built are `#[inline]`: their callers are in `mod.rs`.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::LocalKey;

use super::{Node, MAX_DEPTH};
use crate::realize_lock::{LockExt, Realizing};

thread_local! {
    /// This thread's graph bookkeeping: the pending list and the spares, which a
    /// realisation's `recycle` updates together in one access.
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            pending: Vec::new(),
            spares: Vec::new(),
        })
    };
}

struct Local {
    /// Every pending node this thread built and not yet known realised (weak: dropping a
    /// pending result forgets it). `realize_all` walks it at an optimizer step or a
    /// synchronize. Per thread: another thread's optimizer step must not realise this
    /// thread's half-built groups, which would cut them where this thread's program does not
    /// (in f16 and bf16 storage a cut rounds an intermediate: results would depend on timing).
    pending: Vec<Weak<Node>>,
    /// Spare nodes: members that died in one of this thread's realisations, kept with their
    /// allocation for `Node::new` to reuse. A chain of 1000 ops otherwise pays 1000 mallocs
    /// and frees, about half of building a node.
    spares: Vec<Spare>,
}

/// Most spare nodes a thread keeps (a chain's worth, `MAX_DEPTH`: about 200 KiB).
const MAX_SPARES: usize = MAX_DEPTH as usize;

/// This thread's pending list, emptied (for `realize_all`).
pub(super) fn take_pending() -> Vec<Weak<Node>> {
    LOCAL.with(|local| local.borrow_mut().pending.drain(..).collect())
}

/// Enters `node`, just built pending, in this thread's pending list: by `weak`, the entry a
/// spare handed over, or a new one.
#[inline]
pub(super) fn track_pending(node: &Arc<Node>, weak: Option<Weak<Node>>) {
    LOCAL.with(|local| {
        let list = &mut local.borrow_mut().pending;
        if list.len() >= list.capacity() && list.len() >= 1024 {
            // Forget dropped nodes before growing (amortised O(1)). Counting, not
            // upgrading: an upgrade would raise the count another thread's scheduler
            // is reading. Realised nodes go at the next `realize_all`.
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(weak.unwrap_or_else(|| Arc::downgrade(node)));
    });
}

/// One of this thread's spares, for `Node::new` to build in.
#[inline]
pub(super) fn pop_spare() -> Option<Spare> {
    LOCAL.with(|local| local.borrow_mut().spares.pop())
}

/// Keeps the members of `members` (`Group::release`'s, all `Some`) nothing else holds as
/// spares; drops the others, leaving `members` empty.
pub(super) fn recycle(members: &mut Vec<Option<Arc<Node>>>, lock: &Realizing) {
    let spared = LOCAL.with(|local| {
        let Local { pending, spares } = &mut *local.borrow_mut();
        let before = spares.len();
        // Newest first: a chain built in order is the pending list's tail. A member's entry
        // there goes with it (it is realised or dead, so `realize_all` needs it no more): into
        // the spare, for the node built in it next.
        for m in members.drain(..).rev().flatten() {
            let weak = match pending.last() {
                Some(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(&m)) => pending.pop(),
                _ => None,
            };
            if spares.len() < MAX_SPARES && m.buffer.get().is_none() {
                spares.extend(Spare::new(m, weak, lock));
            }
        }
        spares.len() - before
    });
    // No longer live nodes (`Drop` does not count a spare): one update for the group.
    count_live(-(spared as i64));
}

/// A node's allocation that nothing else can reach, for `Node::new` to build in: its one
/// strong reference and its one weak reference, if any (its entry in this thread's pending
/// list, which the node built in it takes over), are both here. It holds no device, buffer
/// or op (only its last layout), so it keeps no device alive and is not a live node.
///
/// Why not `Arc::get_mut`: it fails while a weak reference exists, and checking uniqueness,
/// dropping the entry and making a new one for the next node are four locked instructions
/// per op (a chain's host time is mostly such counts). A spare checks once, with loads.
pub(super) struct Spare {
    node: Arc<Node>,
    weak: Option<Weak<Node>>,
}

impl Spare {
    /// `node` as a spare, with `weak` its entry in this thread's pending list, if nothing
    /// else holds it (`None`: something does). Under the scheduler's lock (`lock`), which
    /// every upgrade of a weak reference to a node takes (`realize_all`).
    fn new(mut node: Arc<Node>, weak: Option<Weak<Node>>, _lock: &Realizing) -> Option<Spare> {
        if weak.is_none() {
            Arc::get_mut(&mut node)?;
        } else {
            // The strong count first: once it is 1 (ours), no other strong reference can be
            // made, as none is upgraded while we hold the lock. Then the weak count: exactly
            // 1 is ours alone (one being locked by `Arc::get_mut` elsewhere reads 0).
            if Arc::strong_count(&node) != 1 || Arc::weak_count(&node) != 1 {
                return None;
            }
            // What another thread did with the node before dropping its reference (a
            // release decrement, read above) happens before what is done with it here.
            std::sync::atomic::fence(Ordering::Acquire);
        }
        let mut spare = Spare { node, weak };
        let n = spare.node_mut();
        debug_assert!(
            n.pending.get_mut().is_none(),
            "the group's release dropped every member's op"
        );
        n.device = None;
        Some(spare)
    }

    /// The node, to build another in.
    pub(super) fn node_mut(&mut self) -> &mut Node {
        // SAFETY: the one strong reference and the one weak reference (if any) are this
        // spare's, checked in `new` (no other existed then, so none can have been made
        // since: references are made from references), and the weak one is not upgraded
        // while it is here. So, as after `Arc::get_mut`, nothing else can read or write the
        // node while the returned borrow of `self` lives. `Arc::as_ptr` is the allocation's
        // own pointer, valid for writes of the node it owns (what `get_mut` returns).
        unsafe { &mut *(Arc::as_ptr(&self.node) as *mut Node) }
    }

    /// The node built in the spare, and the spare's weak reference, if it had one.
    pub(super) fn into_parts(self) -> (Arc<Node>, Option<Weak<Node>>) {
        (self.node, self.weak)
    }
}

/// A thread's scratch value, kept from one use to the next for its allocations (`collect`'s
/// lists, `lower`'s product). Taken while in use, so a realisation nested in another (a
/// prerequisite's) finds the slot empty and starts its own; put back empty, holding no node.
pub(super) type Scratch<T> = Cell<Option<T>>;

/// The value in `slot`, or a new one where it is in use or was never filled.
pub(super) fn take_scratch<T: Default>(slot: &'static LocalKey<Scratch<T>>) -> T {
    slot.take().unwrap_or_default()
}

/// Puts `value` back in `slot` for the next use (dropped if the thread is exiting).
pub(super) fn put_scratch<T>(slot: &'static LocalKey<Scratch<T>>, value: T) {
    let _ = slot.try_with(|s| s.set(Some(value)));
}

/// Live graph nodes, counted per thread: every node built and dropped would otherwise pay
/// a locked instruction on one shared counter, a large share of a lazy op's host time.
/// Each thread adds to its own counter with plain loads and stores; `live_nodes` sums them.
struct LiveCount(Arc<AtomicI64>);

/// Every running thread's counter (registered on first use).
static LIVE_COUNTS: Mutex<Vec<Arc<AtomicI64>>> = Mutex::new(Vec::new());
/// What exited threads counted (and counts made while a thread's counter is gone).
static LIVE_RETIRED: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static LIVE_HERE: LiveCount = {
        let count = Arc::new(AtomicI64::new(0));
        LIVE_COUNTS
            .locked()
            .push(count.clone());
        LiveCount(count)
    };
}

impl Drop for LiveCount {
    fn drop(&mut self) {
        // Under the registry's lock: a sum sees this thread's count in one place or the other.
        let mut counts = LIVE_COUNTS.locked();
        LIVE_RETIRED.fetch_add(self.0.load(Ordering::Relaxed), Ordering::Relaxed);
        counts.retain(|c| !Arc::ptr_eq(c, &self.0));
    }
}

/// Adds `delta` live nodes (this thread's counter: only this thread writes it).
#[inline]
pub(super) fn count_live(delta: i64) {
    let counted = LIVE_HERE.try_with(|c| {
        c.0.store(c.0.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
    });
    if counted.is_err() {
        LIVE_RETIRED.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Graph nodes alive in the process: every thread's count and the exited threads'.
pub(super) fn live_nodes() -> u64 {
    let counts = LIVE_COUNTS.locked();
    let live = LIVE_RETIRED.load(Ordering::Relaxed)
        + counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<i64>();
    live.max(0) as u64
}
