//! The lazy graph: element-wise ops build nodes; nothing runs until a value is needed.
//!
//! A `Node` is one dense array: realised (it owns a buffer) or pending (an element-wise op
//! over input views of other nodes). Views (`Layout`s) are metadata on the tensors that point
//! at a node, so a transpose or broadcast of a pending result costs nothing.
//!
//! Realisation (a host read, a library kernel that needs the buffer, `Device::synchronize`,
//! or a chain growing past `MAX_DEPTH`) runs the scheduler's passes over the pending nodes
//! the target depends on:
//! 1. `collect`: the fusion group — every pending node reachable from the target through
//!    *dense* edges (the consumer reads the producer's elements in order, so one kernel can
//!    compute both at the same index). A pending input read through any other view
//!    (transposed, broadcast, sliced) is a prerequisite, realised first as its own group.
//! 2. outputs: a member is written to memory only if something outside the group holds it
//!    (a user's tensor, a saved tensor for backward, another pending node): the target, and
//!    members whose reference count exceeds their uses inside the group. Decided in `lower`'s
//!    walk over the members.
//! 3. `lower`: the group becomes one `FusedKernel` (expression DAG in topological order,
//!    inputs deduplicated, dimensions merged per input view) whose signature finds its
//!    compiled pipeline in the device's kernel cache — the schedule cache: an identical step
//!    generates and compiles nothing.
//! 4. `run`: output buffers come from the caching pool; the dispatch is recorded; the
//!    members' pending ops are dropped, which releases their inputs (the memory plan: a
//!    buffer returns to the pool once its last reader is recorded). Members nothing else
//!    holds become this thread's spare nodes, whose allocations later nodes reuse.
//!
//! A reduction of a pending result takes the group as its prologue instead
//! (`with_prologue`): the reduction computes the elements where it would load them, and
//! its first step also stores the members something else holds (the root included, if it
//! is held), which it would otherwise read back after their own kernel stored them.
//!
//! A matrix product is a pending node as well, but never a group member: a group that reads
//! it may have the product compute its first members in the matmul kernel's epilogue (a
//! bias, an activation, a residual, a cast), and it is otherwise recorded as it was asked
//! for, the first time something needs it (`epilogue`).
//!
//! This file holds the nodes, the pending ops and the realisation's entry points, with
//! pass 4; the fusion group, its collection and its lowering (passes 1 to 3) are in `group`,
//! the products in `epilogue`.
//!
//! The design decision a reader must know: fusion never recomputes. An element-wise result
//! is either computed once inside one kernel, or stored; a view that reorders elements
//! always reads stored data.

mod epilogue;
mod group;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use helios_kernels::{BinaryOp, Compare, FusedKernel, Geometry, UnaryOp};
use helios_vk::{Access, Buffer, MemoryLocation};

use crate::realize_lock::{LockExt, RealizeCell, Realizing};
use crate::{DType, Device, Layout, Result};
use group::{collect_ready, lower, to_u32, Group, Lists};

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

/// Counters of the scheduler's work since the process started (tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Fused kernels dispatched.
    pub kernels: u64,
    /// Pending nodes computed by them.
    pub nodes: u64,
    /// Outputs they wrote to memory.
    pub outputs: u64,
    /// Groups computed inside a reduction's loads instead (never stored; their nodes count
    /// in `nodes`).
    pub prologues: u64,
    /// Matrix products that computed the element-wise nodes reading them in their epilogue
    /// (those nodes count in `nodes`; no fused kernel ran for them).
    pub epilogues: u64,
    /// Graph nodes (realised or pending) alive now.
    pub live_nodes: u64,
    /// Autograd nodes alive now (recorded ops whose graph has not been released).
    pub live_grad_nodes: u64,
}

static KERNELS: AtomicU64 = AtomicU64::new(0);
static NODES: AtomicU64 = AtomicU64::new(0);
static OUTPUTS: AtomicU64 = AtomicU64::new(0);
static PROLOGUES: AtomicU64 = AtomicU64::new(0);
static EPILOGUES: AtomicU64 = AtomicU64::new(0);
pub(crate) static LIVE_GRAD: AtomicU64 = AtomicU64::new(0);

/// What the scheduler has done so far (process-wide).
pub fn graph_stats() -> GraphStats {
    GraphStats {
        kernels: KERNELS.load(Ordering::Relaxed),
        nodes: NODES.load(Ordering::Relaxed),
        outputs: OUTPUTS.load(Ordering::Relaxed),
        prologues: PROLOGUES.load(Ordering::Relaxed),
        epilogues: EPILOGUES.load(Ordering::Relaxed),
        live_nodes: live_nodes(),
        live_grad_nodes: LIVE_GRAD.load(Ordering::Relaxed),
    }
}

/// Live graph nodes, counted per thread: every node built and dropped would otherwise pay
/// a locked instruction on one shared counter, a large share of a lazy op's host time.
/// Each thread adds to its own counter with plain loads and stores; `graph_stats` sums them.
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
fn count_live(delta: i64) {
    let counted = LIVE_HERE.try_with(|c| {
        c.0.store(c.0.load(Ordering::Relaxed) + delta, Ordering::Relaxed);
    });
    if counted.is_err() {
        LIVE_RETIRED.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Graph nodes alive in the process: every thread's count and the exited threads'.
fn live_nodes() -> u64 {
    let counts = LIVE_COUNTS.locked();
    let live = LIVE_RETIRED.load(Ordering::Relaxed)
        + counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<i64>();
    live.max(0) as u64
}

thread_local! {
    /// This thread's graph bookkeeping: the pending list and the spares, which a
    /// realisation's `recycle` updates together in one access.
    static LOCAL: std::cell::RefCell<Local> = const {
        std::cell::RefCell::new(Local {
            pending: Vec::new(),
            spares: Vec::new(),
            lists: Lists::new(),
            lowered: None,
        })
    };
}

struct Local {
    /// Every pending node this thread built and not yet known realised (weak: dropping a
    /// pending result forgets it). `realize_all` walks it at an optimizer step or a
    /// synchronize. Per thread: another thread's optimizer step must not realise this
    /// thread's half-built groups, which would cut them where this thread's program does not
    /// (in f16 and bf16 storage a cut rounds an intermediate: results would depend on timing).
    pending: Vec<std::sync::Weak<Node>>,
    /// Spare nodes: members that died in one of this thread's realisations, kept with their
    /// allocation for `Node::new` to reuse. A chain of 1000 ops otherwise pays 1000 mallocs
    /// and frees, about half of building a node.
    spares: Vec<Spare>,
    /// The lists of the last fusion group, whose allocations the next one reuses.
    lists: Lists,
    /// The last realisation's lowering, whose allocations the next one reuses (it holds no
    /// node between realisations).
    lowered: Option<Lowered>,
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
    let pending: Vec<std::sync::Weak<Node>> =
        LOCAL.with(|local| local.borrow_mut().pending.drain(..).collect());
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

/// Most spare nodes a thread keeps (a chain's worth, `MAX_DEPTH`: about 200 KiB).
const MAX_SPARES: usize = MAX_DEPTH as usize;

/// Keeps the members of `members` (`Group::release`'s, all `Some`) nothing else holds as
/// spares; drops the others, leaving `members` empty.
fn recycle(members: &mut Vec<Option<Arc<Node>>>, lock: &Realizing) {
    let spared = LOCAL.with(|local| {
        let Local {
            pending, spares, ..
        } = &mut *local.borrow_mut();
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
struct Spare {
    node: Arc<Node>,
    weak: Option<std::sync::Weak<Node>>,
}

impl Spare {
    /// `node` as a spare, with `weak` its entry in this thread's pending list, if nothing
    /// else holds it (`None`: something does). Under the scheduler's lock (`lock`), which
    /// every upgrade of a weak reference to a node takes (`realize_all`).
    fn new(
        mut node: Arc<Node>,
        weak: Option<std::sync::Weak<Node>>,
        _lock: &Realizing,
    ) -> Option<Spare> {
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
            "run dropped every member's op"
        );
        n.device = None;
        Some(spare)
    }

    /// The node, to build another in.
    fn node_mut(&mut self) -> &mut Node {
        // SAFETY: the one strong reference and the one weak reference (if any) are this
        // spare's, checked in `new` (no other existed then, so none can have been made
        // since: references are made from references), and the weak one is not upgraded
        // while it is here. So, as after `Arc::get_mut`, nothing else can read or write the
        // node while the returned borrow of `self` lives. `Arc::as_ptr` is the allocation's
        // own pointer, valid for writes of the node it owns (what `get_mut` returns).
        unsafe { &mut *(Arc::as_ptr(&self.node) as *mut Node) }
    }
}

impl Node {
    /// A realised node owning `buffer`, a row-major array of `layout`'s shape.
    pub(crate) fn realized(
        device: Device,
        dtype: DType,
        layout: &Layout,
        buffer: Buffer,
    ) -> Arc<Node> {
        let spare = LOCAL.with(|local| local.borrow_mut().spares.pop());
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
        count_live(1);
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
            return (spare.node, spare.weak);
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
        let spare = LOCAL.with(|local| local.borrow_mut().spares.pop());
        let (node, weak) = Node::new(
            spare,
            device,
            dtype,
            layout,
            OnceLock::new(),
            pending,
            depth,
        );
        LOCAL.with(|local| {
            let list = &mut local.borrow_mut().pending;
            if list.len() >= list.capacity() && list.len() >= 1024 {
                // Forget dropped nodes before growing (amortised O(1)). Counting, not
                // upgrading: an upgrade would raise the count another thread's scheduler
                // is reading. Realised nodes go at the next `realize_all`.
                list.retain(|w| w.strong_count() > 0);
            }
            list.push(weak.unwrap_or_else(|| Arc::downgrade(&node)));
        });
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
        count_live(-1);
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

/// Realises `root`.
fn realize(root: &Arc<Node>, location: MemoryLocation, lock: &Realizing) -> Result<()> {
    if root.is_pending_product() {
        return epilogue::realize_product(root, location, lock);
    }
    // Taken from this thread's slot and put back (a prerequisite's realisation, nested in
    // this one, finds the slot empty and starts its own).
    let mut lowered = LOCAL
        .with(|local| local.borrow_mut().lowered.take())
        .unwrap_or_default();
    let result = realize_with(root, location, lock, &mut lowered);
    lowered.clear();
    LOCAL.with(|local| local.borrow_mut().lowered = Some(lowered));
    result
}

/// `realize`, lowering into `lowered`.
fn realize_with(
    root: &Arc<Node>,
    location: MemoryLocation,
    lock: &Realizing,
    lowered: &mut Lowered,
) -> Result<()> {
    loop {
        let Some(group) = collect_ready(root, lock)? else {
            return Ok(());
        };
        lower(&group, root, lowered)?;
        let budget = root
            .device()
            .context()
            .caps()
            .limits
            .max_push_constants_size;
        let push = FusedKernel::push_bytes(
            lowered.kernel.inputs.len(),
            lowered.outputs.len(),
            lowered.scalars.len(),
        );
        if push > budget && group.len() > 1 {
            // Too many buffers for one kernel's push constants: realise half the group first.
            let half = group.node(group.len() / 2).clone();
            drop(group);
            lowered.leaves.clear();
            realize(&half, MemoryLocation::DeviceLocal, lock)?;
            continue;
        }
        return run(group, lowered, root, location, lock);
    }
}

/// Pass 3's product: a group's fused kernel, the leaves it reads and its scalar values.
pub(crate) struct Lowered {
    /// The signature, which finds the compiled kernel (the schedule cache).
    pub kernel: FusedKernel,
    /// Per kernel input: the node read, and the element its read starts at.
    pub leaves: Vec<(Arc<Node>, usize)>,
    /// The values of the kernel's scalar parameters.
    pub scalars: Vec<f32>,
    /// The members stored (topological indices): the root, and members held outside the
    /// group.
    outputs: smallvec::SmallVec<[usize; 4]>,
    /// `lower`'s scratch: per kernel input, its instruction.
    input_instr: Vec<u32>,
    /// `lower`'s scratch: per member in topological order, its instruction.
    member_instr: Vec<u32>,
    /// `lower`'s scratch: the views read so far (kernel input, view, the reading op's
    /// shape).
    views: Vec<(usize, Layout, crate::layout::Dims)>,
}

impl Default for Lowered {
    fn default() -> Lowered {
        Lowered {
            kernel: FusedKernel {
                binding: helios_spirv::Binding::DeviceAddress,
                len: 0,
                inputs: Vec::new(),
                code: Vec::new(),
                outputs: Vec::new(),
                scalars: 0,
                vecs: 1,
            },
            leaves: Vec::new(),
            scalars: Vec::new(),
            outputs: smallvec::SmallVec::new(),
            input_instr: Vec::new(),
            member_instr: Vec::new(),
            views: Vec::new(),
        }
    }
}

impl Lowered {
    /// Empties every list, keeping the allocations.
    fn clear(&mut self) {
        self.kernel.inputs.clear();
        self.kernel.code.clear();
        self.kernel.outputs.clear();
        self.leaves.clear();
        self.scalars.clear();
        self.outputs.clear();
        self.input_instr.clear();
        self.member_instr.clear();
        self.views.clear();
    }
}

/// The pending group ending at `root` lowered as a reduction's prologue: the reduction
/// computes the group's elements where it would load the root's, and `reduce` records it,
/// given the lowering (whose kernel and leaves it may take) and the buffers the reduction
/// must also store the group's outputs into. Prerequisites are realised first. `None`
/// (nothing recorded): fusion is off, the root is realised, or the group has too many
/// buffers for the reduction's push constants.
///
/// - Where no one but the caller's tensor holds the root (`root` is that tensor's
///   reference) and no one outside the group holds another member, nothing is stored (the
///   buffers are none). The members stay pending, held by the caller's tensor, but nothing
///   will ever read them.
/// - Otherwise the reduction stores what realising the group would store: every member held
///   outside it, and the root (fusion never recomputes, so a value someone may still read
///   is stored). Those members are then realised, as if by their own kernel, which the
///   reduction saves: a second pass over the group's result, and a dispatch. A method
///   chain's temporaries hold their members; so does a gradient that a linear layer's
///   backward both reduces (the bias) and multiplies.
pub(crate) fn with_prologue<R>(
    root: &Arc<Node>,
    reduce: impl FnOnce(&mut Lowered, &[Buffer]) -> Result<R>,
) -> Result<Option<R>> {
    if !crate::env::fusion() {
        return Ok(None);
    }
    let one = crate::realize_lock::lock();
    let Some(group) = collect_ready(root, &one)? else {
        return Ok(None);
    };
    let last = group.len() - 1;
    debug_assert!(Arc::ptr_eq(group.node(last), root), "the root comes last");
    let mut lowered = Lowered::default();
    lower(&group, root, &mut lowered)?;
    let count = |group: &Group<'_>| {
        NODES.fetch_add(group.len() as u64, Ordering::Relaxed);
        PROLOGUES.fetch_add(1, Ordering::Relaxed);
    };
    // Besides its uses inside the group, the root is held by the group and the caller's
    // tensor; every other member by no one.
    let held_outside = |j: usize| group.held_outside(j) > if j == last { 2 } else { 0 };
    let stored = (0..group.len()).any(held_outside);
    // The reduction's push constants hold the group's addresses (inputs, and the outputs it
    // stores), its own (at most three) and its seven parameters: past the device's budget
    // (128 bytes on lavapipe: a dozen inputs), the group is realised apart, split as
    // `realize` splits any group, and the reduction reads its result.
    let push = FusedKernel::push_bytes(
        lowered.kernel.inputs.len() + 3,
        if stored { lowered.outputs.len() } else { 0 },
        lowered.scalars.len() + 7,
    );
    let ctx = root.device().context();
    if push > ctx.caps().limits.max_push_constants_size {
        return Ok(None);
    }
    if !stored {
        debug_assert_eq!(lowered.outputs[..], [last], "the root alone is an output");
        count(&group);
        return reduce(&mut lowered, &[]).map(Some);
    }
    let buffers = output_buffers(&group, &lowered.outputs, root, MemoryLocation::DeviceLocal)?;
    count(&group);
    let out = reduce(&mut lowered, &buffers)?;
    OUTPUTS.fetch_add(lowered.outputs.len() as u64, Ordering::Relaxed);
    settle(group, &mut lowered, buffers, &one);
    Ok(Some(out))
}

/// A buffer for each stored member (`outputs`, topological indices), the root's in
/// `root_location`.
fn output_buffers(
    group: &Group<'_>,
    outputs: &[usize],
    root: &Arc<Node>,
    root_location: MemoryLocation,
) -> Result<smallvec::SmallVec<[Buffer; 4]>> {
    let ctx = root.device().context();
    outputs
        .iter()
        .map(|&o| {
            let m = group.node(o);
            let bytes = (m.len * m.dtype.size()).max(4) as u64;
            let location = match Arc::ptr_eq(m, root) {
                true => root_location,
                false => MemoryLocation::DeviceLocal,
            };
            Ok(ctx.create_buffer(bytes, location)?)
        })
        .collect()
}

/// After the dispatch that computes the group is recorded: the stored members take their
/// buffers, every member's op is dropped, and members no one else holds become spares.
fn settle(
    mut group: Group<'_>,
    lowered: &mut Lowered,
    buffers: smallvec::SmallVec<[Buffer; 4]>,
    lock: &Realizing,
) {
    for (&o, b) in lowered.outputs.iter().zip(buffers) {
        let _ = group.node(o).buffer.set(b);
    }
    let members = group.release();
    lowered.leaves.clear();
    recycle(members, lock);
}

/// Each leaf's first element (what a descriptor-bound kernel adds to its indices).
pub(crate) fn element_offsets(
    leaves: &[(Arc<Node>, usize)],
) -> Result<smallvec::SmallVec<[u32; 8]>> {
    leaves.iter().map(|&(_, o)| to_u32(o)).collect()
}

/// Pass 4: record the kernel, hand out buffers, release the members' inputs.
fn run(
    group: Group<'_>,
    lowered: &mut Lowered,
    root: &Arc<Node>,
    root_location: MemoryLocation,
    lock: &Realizing,
) -> Result<()> {
    let Lowered {
        kernel,
        leaves,
        scalars,
        outputs,
        ..
    } = lowered;
    let device = root.device();
    let ctx = device.context();
    let debug = crate::env::debug();
    let compiled = device.fused_kernel(kernel)?;
    let buffers = output_buffers(&group, outputs, root, root_location)?;
    let mut in_addrs: smallvec::SmallVec<[u64; 8]> = smallvec::SmallVec::new();
    for (node, offset) in leaves.iter() {
        let b = node.buffer.get().expect("leaves are realised");
        in_addrs.push(b.device_address() + (offset * node.dtype.size()) as u64);
    }
    let out_addrs: smallvec::SmallVec<[u64; 4]> =
        buffers.iter().map(|b| b.device_address()).collect();
    let launch = kernel.launch(
        &compiled.module,
        Geometry {
            workgroup: compiled.workgroup[0],
            max_groups_x: device.max_groups_x(),
        },
        &in_addrs,
        &out_addrs,
        scalars,
        &element_offsets(leaves)?,
    )?;
    {
        let mut accesses: smallvec::SmallVec<[Access; 8]> = leaves
            .iter()
            .map(|(n, _)| Access::read(n.buffer.get().expect("leaves are realised")))
            .collect();
        accesses.extend(buffers.iter().map(Access::write));
        ctx.dispatch(&compiled.pipeline, launch.groups, &launch.push, &accesses)?;
    }
    if debug {
        let bytes_in: usize = leaves.iter().map(|(n, _)| n.len * n.dtype.size()).sum();
        let bytes_out: usize = outputs
            .iter()
            .map(|&o| group.node(o).len * group.node(o).dtype.size())
            .sum();
        let ops: Vec<&str> = (0..group.len()).map(|j| group.op(j).op.name()).collect();
        eprintln!(
            "helios: realise {}: {} nodes [{}], {} inputs, {} outputs, {} elements, {} B read, {} B written",
            kernel.name(),
            group.len(),
            ops.join(" "),
            leaves.len(),
            outputs.len(),
            kernel.len,
            bytes_in,
            bytes_out
        );
    }
    KERNELS.fetch_add(1, Ordering::Relaxed);
    NODES.fetch_add(group.len() as u64, Ordering::Relaxed);
    OUTPUTS.fetch_add(outputs.len() as u64, Ordering::Relaxed);
    settle(group, lowered, buffers, lock);
    Ok(())
}
