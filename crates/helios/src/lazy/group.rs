//! A fusion group: the scheduler's pass 1 (`collect`: the pending nodes a root reaches
//! through dense edges), its pass 3 (`lower`: the group as one `FusedKernel`), and the
//! group's end: `Group::release` once it has run, or its `Drop` giving every op back if not.
//!
//! The design decision a reader must know: a group owns its members' ops, taken out of the
//! nodes, and holds each member other than the root only through the input of the op that
//! found it (`held_at`), with no reference count of its own. All of it lives under the
//! scheduler's lock, which the group carries (`&Realizing`) for as long as it exists: the
//! nodes' marks that say who is a member are read under it, and a dropped group puts its
//! ops back under it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use helios_kernels::{BinaryOp, FusedDims, FusedInput, Instr, Window};
use helios_vk::MemoryLocation;

use super::{epilogue, realize, ElemOp, Input, Lowered, Node, Pending, LOCAL};
use crate::layout::{is_contiguous, merge_dims_one, Dims};
use crate::realize_lock::Realizing;
use crate::{Error, Layout, Result};

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
    /// `Local::lists` and put back when the group is dropped.
    lists: Lists,
    /// The collection's epoch: a node is a member when its `mark` is this epoch and its
    /// `slot` a member index (in `order`).
    epoch: u64,
    /// Pending nodes read through other views: realised before the group.
    prerequisites: Vec<Arc<Node>>,
}

/// The lists a group is built in, kept by the thread from one group to the next for their
/// allocations. Empty between groups: they hold no node then.
pub(super) struct Lists {
    /// Per member, in the order `collect` expanded them (the root's first): its op.
    taken: Vec<Pending>,
    /// Per member, in the same order: the input that holds it (the root's is `ROOT`). An
    /// op found a member before it expanded it, so `held_at[e].op < e`.
    held_at: Vec<At>,
    /// The members in topological order, as indices in `taken`.
    order: Vec<u32>,
    /// `collect`'s work list.
    stack: Vec<Visit>,
    /// The members `Group::release` hands back, in topological order.
    members: Vec<Option<Arc<Node>>>,
}

impl Lists {
    pub(super) const fn new() -> Lists {
        Lists {
            taken: Vec::new(),
            held_at: Vec::new(),
            order: Vec::new(),
            stack: Vec::new(),
            members: Vec::new(),
        }
    }
}

/// A step of `collect`'s walk: a node found where the group holds it, or an expanded member
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
        let mut lists = std::mem::replace(&mut self.lists, Lists::new());
        lists.members.clear();
        let _ = LOCAL.try_with(|local| local.borrow_mut().lists = lists);
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

    /// A member's uses by other members through dense edges (counted by `collect`).
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

/// Pass 1: the pending nodes `root` reaches through dense edges.
pub(super) fn collect<'r>(root: &Arc<Node>, lock: &'r Realizing) -> Group<'r> {
    let epoch = EPOCH.fetch_add(1, Ordering::Relaxed) + 1;
    // This thread's lists (a group realising a prerequisite of another runs while that one
    // is dropped, so one set serves).
    let mut lists =
        LOCAL.with(|local| std::mem::replace(&mut local.borrow_mut().lists, Lists::new()));
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
            // read it into its epilogue (`collect_ready`).
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

/// `collect(root)` once every prerequisite is realised (`None`: the root is realised, or
/// was a product and is now). A pending product the group reads takes the members that
/// follow it into its epilogue where they fit (`epilogue::fold_target`); the others are
/// realised as they are.
pub(super) fn collect_ready<'r>(
    root: &Arc<Node>,
    lock: &'r Realizing,
) -> Result<Option<Group<'r>>> {
    loop {
        if root.is_realized() {
            return Ok(None);
        }
        if root.is_pending_product() {
            epilogue::realize_product(root, MemoryLocation::DeviceLocal, lock)?;
            return Ok(None);
        }
        let mut group = collect(root, lock);
        if group.prerequisites.is_empty() {
            return Ok(Some(group));
        }
        let pre = take_prerequisites(&mut group);
        let fold = epilogue::fold_target(&group, &pre, lock);
        drop(group);
        if let Some((end, product)) = fold {
            drop(pre);
            epilogue::fold(&end, product, lock)?;
            continue;
        }
        for p in pre {
            realize(&p, MemoryLocation::DeviceLocal, lock)?;
        }
    }
}

/// Takes the prerequisites `collect` found (the group then has none).
pub(super) fn take_prerequisites(g: &mut Group<'_>) -> Vec<Arc<Node>> {
    std::mem::take(&mut g.prerequisites)
}

/// Passes 2 and 3: the group as one fused kernel storing the members held outside it,
/// written into `out`, whose allocations it reuses (a group like the last one lowered
/// allocates nothing).
pub(super) fn lower(g: &Group<'_>, root: &Arc<Node>, out: &mut Lowered) -> Result<()> {
    let device = root.device();
    out.clear();
    let Lowered {
        kernel,
        leaves,
        scalars,
        outputs,
        input_instr,
        member_instr,
        views,
    } = out;
    let (code, inputs) = (&mut kernel.code, &mut kernel.inputs);
    // Pass 2: member `j`, computed by instruction `at`, is stored when something outside
    // the group holds it, and so is the root (the last member).
    let stored = &mut kernel.outputs;
    let mut store = |j: usize, m: &Arc<Node>, at: u32| {
        if Arc::strong_count(m) > g.uses(m) || j + 1 == g.len() {
            outputs.push(j);
            stored.push((at, m.dtype.storage()));
        }
    };
    for j in 0..g.len() {
        let (m, p) = (g.node(j), g.op(j));
        // Per input (at most three: `where`), its instruction.
        let mut args = [0u32; 3];
        if let ElemOp::Pad { dim, start, full } = p.op {
            let i = &p.inputs[0];
            let view = i.view.as_ref().expect("a padded input keeps its view");
            let padded = |d: usize| if d == dim { full } else { view.shape()[d] };
            inputs.push(FusedInput {
                dtype: i.node.dtype.storage(),
                shape: (0..view.ndim())
                    .map(|d| to_u32(padded(d)))
                    .collect::<Result<_>>()?,
                strides: view
                    .strides()
                    .iter()
                    .map(|&v| to_u32(v))
                    .collect::<Result<_>>()?,
                aligned: false,
                window: Some(Window {
                    dim: dim as u8,
                    start: to_u32(start)?,
                    len: to_u32(view.shape()[dim])?,
                }),
            });
            leaves.push((i.node.clone(), view.offset()));
            code.push(Instr::Input((inputs.len() - 1) as u16));
            input_instr.push((code.len() - 1) as u32);
            member_instr.push((code.len() - 1) as u32);
            store(j, m, (code.len() - 1) as u32);
            continue;
        }
        // The op's output shape (the inputs broadcast together), for reads of stored inputs.
        let mut shape: Option<Dims> = None;
        for (k, i) in p.inputs.iter().enumerate() {
            if let Some(at) = g.member(&i.node) {
                if dense_edge(i, m.len) {
                    args[k] = member_instr[at];
                    continue;
                }
            }
            // A view read before at this shape (a broadcast bias, added again and again)
            // is that read, found without working it out again.
            if let Some(view) = &i.view {
                let shape = shape.get_or_insert_with(|| out_shape(&p.inputs));
                let seen = |(x, v, s): &&(usize, Layout, Dims)| {
                    Arc::ptr_eq(&leaves[*x].0, &i.node) && v.same(view) && s == shape
                };
                if let Some(&(x, ..)) = views.iter().find(seen) {
                    args[k] = input_instr[x];
                    continue;
                }
            }
            let (input, offset) = read(i, m.len, &p.inputs, &mut shape)?;
            // The same leaf read the same way is one kernel input.
            let same = |((n, o), r): (&(Arc<Node>, usize), &FusedInput)| {
                Arc::ptr_eq(n, &i.node) && *o == offset && *r == input
            };
            let x = match leaves.iter().zip(inputs.iter()).position(same) {
                Some(x) => x,
                None => {
                    inputs.push(input);
                    leaves.push((i.node.clone(), offset));
                    code.push(Instr::Input((inputs.len() - 1) as u16));
                    input_instr.push((code.len() - 1) as u32);
                    inputs.len() - 1
                }
            };
            if let (Some(view), Some(shape)) = (&i.view, &shape) {
                views.push((x, view.clone(), shape.clone()));
            }
            args[k] = input_instr[x];
        }
        let mut constant = |code: &mut Vec<Instr>, s: f32| {
            let i = match scalars.iter().position(|x| x.to_bits() == s.to_bits()) {
                Some(i) => i,
                None => {
                    scalars.push(s);
                    scalars.len() - 1
                }
            };
            code.push(Instr::Scalar(i as u16));
            (code.len() - 1) as u32
        };
        let ins = match p.op {
            ElemOp::Unary(u) => Instr::Unary(u, args[0]),
            ElemOp::Binary(b) => Instr::Binary(b, args[0], args[1]),
            ElemOp::Scalar {
                op,
                s,
                scalar_first,
            } => {
                // The fused max and min take their scalar to be a number (`Instr::Binary`);
                // with a NaN scalar every element is NaN, which `x + NaN` computes.
                let op = match op {
                    BinaryOp::Max | BinaryOp::Min if s.is_nan() => BinaryOp::Add,
                    op => op,
                };
                let c = constant(code, s);
                match scalar_first {
                    true => Instr::Binary(op, c, args[0]),
                    false => Instr::Binary(op, args[0], c),
                }
            }
            ElemOp::Compare(c) => Instr::Compare(c, args[0], args[1]),
            ElemOp::CompareScalar(cmp, s) => {
                let c = constant(code, s);
                Instr::Compare(cmp, args[0], c)
            }
            ElemOp::Where => Instr::Where(args[0], args[1], args[2]),
            ElemOp::Cast => Instr::Round(m.dtype.storage(), args[0]),
            ElemOp::Pad { .. } => unreachable!("lowered above"),
            ElemOp::Product { .. } => unreachable!("a product is never a member"),
        };
        code.push(ins);
        member_instr.push((code.len() - 1) as u32);
        store(j, m, (code.len() - 1) as u32);
    }
    kernel.len = u32::try_from(root.len).map_err(|_| {
        Error::Kernel(helios_kernels::KernelError::TooLarge {
            what: "element count",
            size: root.len as u64,
        })
    })?;
    kernel.binding = device.binding();
    kernel.scalars = scalars.len() as u16;
    kernel.vecs = device.config().elementwise_vecs.unwrap_or(1);
    debug_assert!(kernel.check().is_ok(), "{:?}", kernel.check());
    Ok(())
}

/// How an op of `len` elements over `op_inputs` reads its stored input `i`: the kernel
/// input, and the element of `i`'s node where the read starts. The whole node, dense,
/// element for element (however it is shaped), or its view broadcast to the op's shape
/// (`shape`, computed on first need), dimensions merged.
fn read(
    i: &Input,
    len: usize,
    op_inputs: &[Input],
    shape: &mut Option<Dims>,
) -> Result<(FusedInput, usize)> {
    let dtype = i.node.dtype.storage();
    let whole = || -> Result<(FusedInput, usize)> {
        let input = FusedInput {
            dtype,
            shape: FusedDims::from_slice(&[to_u32(i.node.len)?]),
            strides: FusedDims::from_slice(&[1]),
            aligned: true,
            window: None,
        };
        Ok((input, 0))
    };
    let Some(layout) = &i.view else {
        return whole();
    };
    let shape = shape.get_or_insert_with(|| out_shape(op_inputs));
    let strides = layout
        .broadcast_strides(shape)
        .expect("shapes were checked when the node was built");
    if layout.offset() == 0 && len == i.node.len && is_contiguous(shape, &strides) {
        return whole();
    }
    let (shape, strides) = merge_dims_one(shape, &strides);
    let input = FusedInput {
        dtype,
        shape: shape.iter().map(|&v| to_u32(v)).collect::<Result<_>>()?,
        strides: strides.iter().map(|&v| to_u32(v)).collect::<Result<_>>()?,
        aligned: layout.offset() % 4 == 0,
        window: None,
    };
    Ok((input, layout.offset()))
}

/// A size, stride or offset as the kernels' 32-bit index arithmetic takes it.
pub(super) fn to_u32(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Kernel(helios_kernels::KernelError::TooLarge {
            what: "stride or size",
            size: v as u64,
        })
    })
}

/// The broadcast shape of an op's inputs.
fn out_shape(inputs: &[Input]) -> Dims {
    let mut views = inputs.iter().map(|i| {
        i.view
            .as_ref()
            .expect("an op's inputs all have views, or none")
    });
    let mut shape = Dims::from_slice(views.next().expect("ops have inputs").shape());
    for view in views {
        // Usually the shape already: a broadcast operand read beside a full one.
        if view.broadcast_strides(&shape).is_none() {
            let wider = crate::layout::broadcast_shapes(&shape, view.shape())
                .expect("shapes were checked when the node was built");
            shape = Dims::from_vec(wider);
        }
    }
    shape
}
