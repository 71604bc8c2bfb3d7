//! The lazy graph: element-wise ops build nodes; nothing runs until a value is needed.
//!
//! A `Node` is one dense array: realised (it owns a buffer) or pending (an element-wise op
//! over input views of other nodes). Views (`Layout`s) are metadata on the tensors that point
//! at a node, so a transpose or broadcast of a pending result costs nothing.
//!
//! Realisation (a host read, a library kernel that needs the buffer, `Device::synchronize`,
//! or a chain growing past `MAX_DEPTH`) runs the scheduler's passes over the pending nodes
//! the target depends on; `realize_with` is the driver, one named function per pass:
//! 1. `collect`: the fusion group — every pending node reachable from the target through
//!    *dense* edges (the consumer reads the producer's elements in order, so one kernel can
//!    compute both at the same index). A pending input read through any other view
//!    (transposed, broadcast, sliced) is a prerequisite, realised first as its own group.
//! 2. `choose_outputs`: a member is written to memory only if something outside the group
//!    holds it (a user's tensor, a saved tensor for backward, another pending node): the
//!    target, and members whose reference count exceeds their uses inside the group.
//! 3. `lower`: the group becomes one `FusedKernel` (expression DAG in topological order,
//!    reads deduplicated, dimensions merged per input view) whose signature finds its
//!    compiled pipeline in the device's kernel cache — the schedule cache: an identical step
//!    generates and compiles nothing. A kernel past the push-constant budget (`push_fits`)
//!    is split: half the group is realised first.
//! 4. `record`: output buffers come from the caching pool; the dispatch is recorded; the
//!    members' pending ops are dropped, which releases their inputs (the memory plan: a
//!    buffer returns to the pool once its last reader is recorded). Members nothing else
//!    holds become this thread's spare nodes, whose allocations later nodes reuse.
//!
//! A reduction of a pending result takes the group as its prologue instead
//! (`with_prologue`): passes 1 to 3, then the reduction computes the elements where it would
//! load them, and its first step also stores the members something else holds.
//!
//! A matrix product is a pending node as well, but never a group member: a group that reads
//! it may have the product compute its first members in the matmul kernel's epilogue (a
//! bias, an activation, a residual, a cast), and it is otherwise recorded as it was asked
//! for, the first time something needs it (`epilogue`).
//!
//! Files: this one holds the nodes, their ops and the driver with pass 1; `group` the
//! fusion group and its walk; `lower` passes 2 and 3, over `reads` (how one input is read);
//! `record` pass 4; `prologue` the reduction's prologue; `epilogue` the products; `recycle`
//! what the passes keep for their allocations (spares, live counts, scratch lists); `stats`
//! the counters and the `HELIOS_DEBUG` report. Imports among them form no circle:
//! `prologue` uses `record`; `record`, `stats` and `epilogue` use `lower` or `group`; `lower`
//! uses `group` and `reads`; `group` uses only `recycle`; `reads` and `recycle` use none.
//!
//! The design decision a reader must know: fusion never recomputes. An element-wise result
//! is either computed once inside one kernel, or stored; a view that reorders elements
//! always reads stored data.

mod epilogue;
mod group;
mod lower;
mod prologue;
mod reads;
mod record;
mod recycle;
mod stats;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use helios_kernels::{BinaryOp, Compare, UnaryOp};
use helios_vk::{Buffer, MemoryLocation};

use crate::realize_lock::{RealizeCell, Realizing};
use crate::{DType, Device, Layout, Result};
use group::{take_prerequisites, Group};
use lower::{choose_outputs, lower, push_fits};
use record::record;
use recycle::{put_scratch, take_scratch, Scratch, Spare};

pub(crate) use lower::Lowered;
pub(crate) use prologue::with_prologue;
pub(crate) use record::element_offsets;
pub(crate) use stats::LIVE_GRAD;
pub use stats::{graph_stats, GraphStats};

/// A pending chain this deep is realised as it grows: bounds kernel size, recursion when a
/// chain is dropped, and the host work a single realisation can pile up.
pub(crate) const MAX_DEPTH: u32 = 1024;

/// An element-wise operation of the graph (inputs are views of other nodes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ElemOp {
    Unary(UnaryOp),
    /// `op(a, b)`.
    Binary(BinaryOp),
    /// `op(x, s)`, or `op(s, x)` when `scalar_first`.
    Scalar {
        op: BinaryOp,
        s: f32,
        scalar_first: bool,
    },
    /// 1.0 where `a op b`, else 0.0.
    Compare(Compare),
    /// 1.0 where `x op s`, else 0.0.
    CompareScalar(Compare, f32),
    /// `c != 0 ? a : b` over (c, a, b).
    Where,
    /// The input converted to the node's dtype.
    Cast,
    /// The input placed at `start..` along `dim` of a zero-filled shape whose size along
    /// `dim` is `full` (every other size is the input's).
    Pad {
        dim: usize,
        start: usize,
        full: usize,
    },
    /// A matrix product over inputs `a`, `b` and, with `bias`, the bias, all realised when
    /// the node was built: `act(alpha · a·b + bias)`. Never a member of a fusion group: a
    /// group reading it may take its epilogue (see `epilogue`).
    Product {
        alpha: f32,
        act: helios_kernels::Activation,
        bias: bool,
    },
}

impl ElemOp {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ElemOp::Unary(u) => u.name(),
            ElemOp::Binary(b) | ElemOp::Scalar { op: b, .. } => b.name(),
            ElemOp::Compare(c) | ElemOp::CompareScalar(c, _) => c.name(),
            ElemOp::Where => "where",
            ElemOp::Cast => "cast",
            ElemOp::Pad { .. } => "pad",
            ElemOp::Product { .. } => "matmul",
        }
    }
}

/// One input of a pending op: a view of another node.
pub(crate) struct Input {
    pub node: Arc<Node>,
    /// The view read, or `None`: the whole node, dense, read element for element at the
    /// op's output shape. Most inputs are that, and `None` costs no reference count on the
    /// way in and out of the graph (a chain's host time is mostly such counts). Either every
    /// input of an op has a view or none has, so the output shape is known from the views
    /// whenever one is needed.
    pub view: Option<Layout>,
}

impl Input {
    /// Whether a read of `node` through `layout` by an op whose output is laid out as `out`
    /// is the whole node, dense, element for element (an `Input` without a view).
    pub(crate) fn plain(node: &Node, layout: &Layout, out: &Layout) -> bool {
        layout.is_dense() && layout.len() == node.len && layout.same_shape(out)
    }
}

pub(crate) struct Pending {
    pub op: ElemOp,
    /// Inline up to two (a `where` spills its third): the node is moved into its `Arc` as it
    /// is built, and every inline byte is copied on each op.
    pub inputs: smallvec::SmallVec<[Input; 2]>,
}

/// One dense array of `len` elements of `dtype`: realised (a buffer) or pending (an op).
pub(crate) struct Node {
    /// `None` only for a spare (see `Spare`), which nothing can reach.
    device: Option<Device>,
    pub dtype: DType,
    /// The array's shape, row-major: the layout of a tensor that views the whole node (most
    /// tensors, which then hold no layout of their own). A spare keeps its last one, so a
    /// node reused for an array of the same shape costs no reference count.
    pub layout: Layout,
    /// `layout.len()`, read in the scheduler's loops.
    pub len: usize,
    buffer: OnceLock<Buffer>,
    /// The op, while pending (and not taken into a group being scheduled).
    pending: RealizeCell<Option<Pending>>,
    /// Longest pending chain below this node (0 once realised).
    depth: u32,
    /// Built as a matrix product (`ElemOp::Product`), which `collect` never takes into a group.
    product: bool,
    /// Scheduler scratch (under the scheduler's lock): the epoch of the last collection that
    /// found this node, its member index there, and its uses inside that group.
    mark: AtomicU64,
    slot: std::sync::atomic::AtomicU32,
    uses: std::sync::atomic::AtomicU32,
}

/// Realises every pending node this thread built that is still alive: before an op that
/// writes buffers in place (an optimizer step), so that nothing recorded earlier reads the
/// new values. A pending result handed to another thread is realised by its reads there or
/// by this thread's next `realize_all`; updating a buffer in place while another thread
/// still has unrealised reads of it is a race, as it is in any eager framework.
pub(crate) fn realize_all() -> Result<()> {
    // Under the lock, so no other thread's realisation runs between the check and ours, and
    // no other thread's scheduler sees the reference counts our upgrades raise: it decides
    // what to store (and what a reduction may compute in its loads) from those counts.
    //
    // Newest first, each node upgraded only while it is realised: a reference taken to every
    // pending node up front made each look held by someone to the scheduler, so every member
    // of every group was stored and no product took a tail. An older node that a newer one's
    // group computes in registers, and nothing else holds, is dead by its turn.
    let one = crate::realize_lock::lock();
    let pending = recycle::take_pending();
    for w in pending.iter().rev() {
        let Some(n) = w.upgrade() else {
            continue;
        };
        // A node another thread's group computed in registers (no one held it then: only
        // this list's weak reference, upgraded afterwards) has neither op nor buffer: it is
        // dead, not pending.
        if n.is_realized() {
            continue;
        }
        let Some(op) = n.pending.take(&one) else {
            continue;
        };
        n.pending.replace(Some(op), &one);
        realize(&n, MemoryLocation::DeviceLocal, &one)?;
    }
    Ok(())
}

impl Node {
    /// A realised node owning `buffer`, a row-major array of `layout`'s shape.
    pub(crate) fn realized(
        device: Device,
        dtype: DType,
        layout: &Layout,
        buffer: Buffer,
    ) -> Arc<Node> {
        let spare = recycle::pop_spare();
        Node::new(
            spare,
            device,
            dtype,
            layout,
            OnceLock::from(buffer),
            None,
            0,
        )
        .0
    }

    /// A node in `spare`'s allocation, or a new one; and the spare's weak reference, if
    /// it had one.
    fn new(
        spare: Option<Spare>,
        device: Device,
        dtype: DType,
        layout: &Layout,
        buffer: OnceLock<Buffer>,
        pending: Option<Pending>,
        depth: u32,
    ) -> (Arc<Node>, Option<std::sync::Weak<Node>>) {
        recycle::count_live(1);
        let product = matches!(&pending, Some(p) if matches!(p.op, ElemOp::Product { .. }));
        if let Some(mut spare) = spare {
            // The spare's allocation takes the new node, field by field: a spare holds no
            // device, buffer or op, so nothing is dropped (only a layout of another shape),
            // and the node is not built on the stack and copied in whole (two copies of ~200
            // bytes per op).
            let n = spare.node_mut();
            n.device = Some(device);
            n.dtype = dtype;
            if !n.layout.same(layout) {
                n.layout = layout.clone();
            }
            n.len = layout.len();
            n.buffer = buffer;
            *n.pending.get_mut() = pending;
            n.depth = depth;
            n.product = product;
            *n.mark.get_mut() = 0;
            *n.slot.get_mut() = 0;
            *n.uses.get_mut() = 0;
            return spare.into_parts();
        }
        let node = Arc::new(Node {
            device: Some(device),
            dtype,
            layout: layout.clone(),
            len: layout.len(),
            buffer,
            pending: RealizeCell::new(pending),
            depth,
            product,
            mark: AtomicU64::new(0),
            slot: Default::default(),
            uses: Default::default(),
        });
        (node, None)
    }

    /// A pending node computing `op` over `inputs` into a row-major array of `layout`'s
    /// shape and `dtype`. With fusion off (`HELIOS_FUSION=0`) or past `MAX_DEPTH`, it is
    /// realised at once.
    pub(crate) fn pending(
        device: Device,
        dtype: DType,
        layout: &Layout,
        op: ElemOp,
        inputs: smallvec::SmallVec<[Input; 2]>,
    ) -> Result<Arc<Node>> {
        let depth = 1 + inputs.iter().map(|i| i.node.depth).max().unwrap_or(0);
        debug_assert!(
            inputs
                .iter()
                .all(|i| i.view.is_some() == inputs[0].view.is_some()),
            "an op's inputs all have views, or none has"
        );
        let pending = Some(Pending { op, inputs });
        // Two accesses, around `Node::new` rather than one around it all: a closure that
        // takes the op copies it once more, which costs more than the second access.
        let spare = recycle::pop_spare();
        let (node, weak) = Node::new(
            spare,
            device,
            dtype,
            layout,
            OnceLock::new(),
            pending,
            depth,
        );
        recycle::track_pending(&node, weak);
        if depth >= MAX_DEPTH || !crate::env::fusion() {
            node.buffer()?;
        }
        Ok(node)
    }

    pub(crate) fn device(&self) -> &Device {
        self.device
            .as_ref()
            .expect("only spares, which nothing can reach, have no device")
    }

    pub(crate) fn is_realized(&self) -> bool {
        self.buffer.get().is_some()
    }

    /// Whether this is a matrix product not yet recorded.
    pub(crate) fn is_pending_product(&self) -> bool {
        self.product && !self.is_realized()
    }

    /// The buffer, taken out (the node is then neither realised nor pending: only for a
    /// scheduler's temporary that nothing else can reach).
    pub(crate) fn take_buffer(&mut self) -> Option<Buffer> {
        self.buffer.take()
    }

    /// The node's buffer, running whatever it depends on first.
    pub(crate) fn buffer(self: &Arc<Node>) -> Result<&Buffer> {
        self.buffer_in(MemoryLocation::DeviceLocal)
    }

    /// `buffer`, the node's own output placed in `location` if it is computed now (a small
    /// result about to be read back goes straight to host memory: one dispatch, no copy).
    pub(crate) fn buffer_in(self: &Arc<Node>, location: MemoryLocation) -> Result<&Buffer> {
        if let Some(b) = self.buffer.get() {
            return Ok(b);
        }
        {
            let one = crate::realize_lock::lock();
            realize(self, location, &one)?;
        }
        Ok(self.buffer.get().expect("realised above"))
    }
}

impl Drop for Node {
    /// Drops long pending chains without deep recursion: inputs held only by this node are
    /// unlinked onto a work list.
    fn drop(&mut self) {
        if self.device.is_none() {
            return; // a spare: not live, holds only a layout
        }
        recycle::count_live(-1);
        let Some(p) = self.pending.get_mut().take() else {
            return;
        };
        let mut work: Vec<Arc<Node>> = p.inputs.into_iter().map(|i| i.node).collect();
        while let Some(n) = work.pop() {
            if let Ok(mut n) = Arc::try_unwrap(n) {
                if let Some(p) = n.pending.get_mut().take() {
                    work.extend(p.inputs.into_iter().map(|i| i.node));
                }
            }
        }
    }
}

thread_local! {
    /// The last realisation's lowering, whose allocations the next one reuses (it holds no
    /// node between realisations).
    static LOWERED: Scratch<Lowered> = const { Scratch::new(None) };
}

/// Realises `root`.
fn realize(root: &Arc<Node>, location: MemoryLocation, lock: &Realizing) -> Result<()> {
    if root.is_pending_product() {
        return epilogue::realize_product(root, location, lock);
    }
    // Taken from this thread's slot and put back (a prerequisite's realisation, nested in
    // this one, finds the slot empty and starts its own).
    let mut lowered = take_scratch(&LOWERED);
    let result = realize_with(root, location, lock, &mut lowered);
    lowered.clear();
    put_scratch(&LOWERED, lowered);
    result
}

/// The scheduler: `realize`, lowering into `lowered`. Each pass is a function: `collect` →
/// `choose_outputs` → `lower` → `record`.
fn realize_with(
    root: &Arc<Node>,
    location: MemoryLocation,
    lock: &Realizing,
    lowered: &mut Lowered,
) -> Result<()> {
    loop {
        let Some(group) = collect(root, lock)? else {
            return Ok(());
        };
        choose_outputs(&group, lowered);
        lower(&group, root, lowered)?;
        let (inputs, outputs) = (lowered.kernel.inputs.len(), lowered.outputs.len());
        if !push_fits(root.device(), inputs, outputs, lowered.scalars.len()) && group.len() > 1 {
            // Too many buffers for one kernel's push constants: realise half the group first.
            let half = group.node(group.len() / 2).clone();
            drop(group);
            lowered.leaves.clear();
            realize(&half, MemoryLocation::DeviceLocal, lock)?;
            continue;
        }
        return record(group, lowered, root, location, lock);
    }
}

/// Pass 1: the fusion group at `root` (`Group::new`), once every prerequisite is realised
/// (`None`: the root is realised, or was a product and is now). A pending product the group
/// reads takes the members that follow it into its epilogue where they fit
/// (`epilogue::fold_target`); the others are realised as they are.
fn collect<'r>(root: &Arc<Node>, lock: &'r Realizing) -> Result<Option<Group<'r>>> {
    loop {
        if root.is_realized() {
            return Ok(None);
        }
        if root.is_pending_product() {
            epilogue::realize_product(root, MemoryLocation::DeviceLocal, lock)?;
            return Ok(None);
        }
        let mut group = Group::new(root, lock);
        let pre = take_prerequisites(&mut group);
        if pre.is_empty() {
            return Ok(Some(group));
        }
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
