//! A fusion group: the walk of the scheduler's pass 1 (`Group::new`: the pending nodes a
//! root reaches through dense edges, which `collect` repeats until it needs no
//! prerequisite), what later passes read of it, and its end: `Group::release` once it has
//! run, or its `Drop` giving every op back if not.
//!
//! The design decision a reader must know: a group owns its members' ops, taken out of the
//! nodes, and holds each member other than the root only through the input of the op that
//! found it (`held_at`), with no reference count of its own. All of it lives under the
//! scheduler's lock, which the group carries (`&Realizing`) for as long as it exists: the
//! nodes' marks that say who is a member are read under it, and a dropped group puts its
//! ops back under it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::recycle::{put_scratch, take_scratch, Scratch};
use super::{ElemOp, Input, Node, Pending};
use crate::realize_lock::Realizing;

thread_local! {
    /// This thread's lists for the next group (see `Lists`).
    static LISTS: Scratch<Lists> = const { Scratch::new(None) };
}

/// Whether a consumer of `len` elements reads `input` element for element: a dense view of
/// the whole node, of the consumer's size (no broadcast).
pub(super) fn dense_edge(input: &Input, len: usize) -> bool {
    input.node.len == len
        && match &input.view {
            None => true,
            Some(l) => l.is_dense() && l.len() == input.node.len,
        }
}

/// A fusion group: pending members in topological order (inputs first).
///
/// The group holds its members' ops while it is scheduled, taken out of the nodes as they
/// join it, so that later passes read them without locking each node again. Run, it drops
/// them (releasing the members' inputs); dropped unrun (prerequisites first, a split, a
/// prologue, an error), it gives them back, and the members are pending as before.
///
/// A member other than the root is held by the group through the input of the op that
/// found it (`held_at`), not by a reference of its own: a chain's realisation would
/// otherwise pay a reference count up and one down per op.
pub(super) struct Group<'r> {
    /// The scheduler's lock, held while the group exists (its ops go back under it).
    lock: &'r Realizing,
    /// The collection's root, its last member.
    pub(super) root: Arc<Node>,
    /// Its members' ops, where it holds them, their order: this thread's lists, taken from
    /// `LISTS` and put back when the group is dropped.
    lists: Lists,
    /// The collection's epoch: a node is a member when its `mark` is this epoch and its
    /// `slot` a member index (in `order`).
    epoch: u64,
    /// Pending nodes read through other views: realised before the group.
    prerequisites: Vec<Arc<Node>>,
}

/// The lists a group is built in, kept by the thread from one group to the next for their
/// allocations (`LISTS`). Empty between groups: they hold no node then.
#[derive(Default)]
struct Lists {
    /// Per member, in the order `Group::new` expanded them (the root's first): its op.
    taken: Vec<Pending>,
    /// Per member, in the same order: the input that holds it (the root's is `ROOT`). An
    /// op found a member before it expanded it, so `held_at[e].op < e`.
    held_at: Vec<At>,
    /// The members in topological order, as indices in `taken`.
    order: Vec<u32>,
    /// `Group::new`'s work list.
    stack: Vec<Visit>,
    /// The members `Group::release` hands back, in topological order.
    members: Vec<Option<Arc<Node>>>,
}

/// A step of `Group::new`'s walk: a node found where the group holds it, or an expanded member
/// (an index in `taken`) waiting below its inputs: it joins the order after all of them.
enum Visit {
    Find(At),
    Place(u32),
}

/// Where a group holds a node: input `slot` of `Group::taken[op]`, or the root (`ROOT`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct At {
    op: u32,
    slot: u32,
}

const ROOT: At = At {
    op: u32::MAX,
    slot: 0,
};

impl Drop for Group<'_> {
    fn drop(&mut self) {
        // Last expanded first: the op holding a member was expanded before it, so it is
        // still here when the member's op goes back.
        while let Some(op) = self.lists.taken.pop() {
            let e = self.lists.taken.len();
            self.node_at(self.lists.held_at[e])
                .pending
                .replace(Some(op), self.lock);
        }
        let mut lists = std::mem::take(&mut self.lists);
        lists.members.clear();
        put_scratch(&LISTS, lists);
    }
}

impl Group<'_> {
    /// Members.
    pub(super) fn len(&self) -> usize {
        self.lists.order.len()
    }

    /// The node held at `at`.
    fn node_at(&self, at: At) -> &Arc<Node> {
        match at {
            ROOT => &self.root,
            At { op, slot } => &self.lists.taken[op as usize].inputs[slot as usize].node,
        }
    }

    /// Member `j`'s node (topological order).
    pub(super) fn node(&self, j: usize) -> &Arc<Node> {
        self.node_at(self.lists.held_at[self.lists.order[j] as usize])
    }

    /// Member `j`'s op (topological order).
    pub(super) fn op(&self, j: usize) -> &Pending {
        &self.lists.taken[self.lists.order[j] as usize]
    }

    /// A member's uses by other members through dense edges (counted by `Group::new`).
    pub(super) fn uses(&self, m: &Node) -> usize {
        m.uses.load(Ordering::Relaxed) as usize
    }

    /// References to member `j` other than its uses inside the group: the group's own
    /// reference to the root, and whoever outside the group holds it.
    pub(super) fn held_outside(&self, j: usize) -> usize {
        let m = self.node(j);
        Arc::strong_count(m) - self.uses(m)
    }

    /// The member index of `n`, if it is a member.
    pub(super) fn member(&self, n: &Node) -> Option<usize> {
        member(n, self.epoch)
    }

    /// Drops every member's op (the group has run) and hands back the members in
    /// topological order (every entry `Some`), each by the reference that held it in the
    /// group. The ops' other inputs are leaves (held by the kernel's `leaves` as well) or
    /// further uses of members, so nothing cascades here.
    pub(super) fn release(&mut self) -> &mut Vec<Option<Arc<Node>>> {
        let n = self.len();
        let epoch = self.epoch;
        let Lists {
            taken,
            held_at,
            order,
            members,
            ..
        } = &mut self.lists;
        members.resize(n, None);
        if let Some(last) = members.last_mut() {
            *last = Some(self.root.clone());
        }
        for (e, op) in taken.drain(..).enumerate() {
            for (k, input) in op.inputs.into_iter().enumerate() {
                let at = At {
                    op: e as u32,
                    slot: k as u32,
                };
                match member(&input.node, epoch) {
                    Some(j) if held_at[order[j] as usize] == at => members[j] = Some(input.node),
                    _ => drop(input),
                }
            }
        }
        debug_assert!(
            members.iter().all(Option::is_some),
            "the group holds every member"
        );
        members
    }
}

/// The member index of `n` in the group collected in `epoch`, if it is a member.
fn member(n: &Node, epoch: u64) -> Option<usize> {
    let slot = n.slot.load(Ordering::Relaxed);
    (n.mark.load(Ordering::Relaxed) == epoch && slot < EXPANDING).then_some(slot as usize)
}

/// Collection epochs: marks on the nodes replace hash sets (the scheduler's hot loop).
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// `Node::slot` of a node found but not yet expanded, and of one being expanded.
const FOUND: u32 = u32::MAX;
const EXPANDING: u32 = u32::MAX - 1;

impl<'r> Group<'r> {
    /// Pass 1's walk: the pending nodes `root` reaches through dense edges, and the pending
    /// nodes they read through other views (the prerequisites).
    pub(super) fn new(root: &Arc<Node>, lock: &'r Realizing) -> Group<'r> {
        let epoch = EPOCH.fetch_add(1, Ordering::Relaxed) + 1;
        // This thread's lists (a group realising a prerequisite of another runs while that one
        // is dropped, so one set serves).
        let mut lists = take_scratch(&LISTS);
        debug_assert!(
            lists.taken.is_empty(),
            "a group's ops were released or given back"
        );
        lists.held_at.clear();
        lists.order.clear();
        lists.members.clear();
        // A group usually holds the root's whole pending chain: room for it up front.
        let chain = root.depth as usize + 1;
        lists.taken.reserve(chain);
        lists.held_at.reserve(chain);
        lists.order.reserve(chain);
        let mut stack = std::mem::take(&mut lists.stack);
        stack.clear();
        stack.reserve(2 * chain);
        let mut g = Group {
            lock,
            root: root.clone(),
            lists,
            epoch,
            prerequisites: Vec::new(),
        };
        // Plain loads and stores, not read-modify-writes: the caller holds the scheduler's
        // lock, so no other thread touches the marks, and a locked instruction per node is most
        // of a chain's collection.
        let found = |n: &Node| {
            if n.mark.load(Ordering::Relaxed) != epoch {
                n.mark.store(epoch, Ordering::Relaxed);
                n.slot.store(FOUND, Ordering::Relaxed);
                n.uses.store(0, Ordering::Relaxed);
            }
        };
        found(root);
        // The input found last is expanded next without a trip through the stack (a chain is
        // walked straight down).
        let mut next = Some(ROOT);
        loop {
            let at = match next.take().map(Visit::Find).or_else(|| stack.pop()) {
                None => break,
                Some(Visit::Place(e)) => {
                    let slot = g.lists.order.len() as u32;
                    g.node_at(g.lists.held_at[e as usize])
                        .slot
                        .store(slot, Ordering::Relaxed);
                    g.lists.order.push(e);
                    continue;
                }
                Some(Visit::Find(at)) => at,
            };
            let n = g.node_at(at);
            if n.slot.load(Ordering::Relaxed) != FOUND {
                continue;
            }
            n.slot.store(EXPANDING, Ordering::Relaxed);
            let len = n.len;
            // From here the group holds it.
            let p = n.pending.take(lock).expect("members are pending");
            let e = g.lists.taken.len() as u32;
            // A padded read shifts coordinates: its input is always stored.
            let pad = matches!(p.op, ElemOp::Pad { .. });
            let below = stack.len();
            for (k, i) in p.inputs.iter().enumerate() {
                if i.node.is_realized() {
                    continue;
                }
                // A product is never a member: it is realised first, or takes the members that
                // read it into its epilogue (`collect`).
                if !pad && !i.node.product && dense_edge(i, len) {
                    found(&i.node);
                    let uses = &i.node.uses;
                    uses.store(uses.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                    let here = At {
                        op: e,
                        slot: k as u32,
                    };
                    if let Some(earlier) = next.replace(here) {
                        stack.push(Visit::Find(earlier));
                    }
                } else {
                    g.prerequisites.push(i.node.clone());
                }
            }
            // Below the inputs just found (those pushed above; usually none: a chain's input is
            // `next`).
            stack.insert(below, Visit::Place(e));
            g.lists.held_at.push(at);
            g.lists.taken.push(p);
        }
        g.lists.stack = stack;
        g
    }
}

/// Takes the prerequisites `Group::new` found (the group then has none).
pub(super) fn take_prerequisites(g: &mut Group<'_>) -> Vec<Arc<Node>> {
    std::mem::take(&mut g.prerequisites)
}
