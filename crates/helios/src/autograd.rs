//! Reverse-mode autograd over the lazy graph.
//!
//! A tensor that needs a gradient carries a `GradLink`: a leaf's accumulator (`requires_grad_`)
//! or the `GradNode` of the op that made it. A `GradNode` holds, per input, where that
//! input's gradient goes, and a one-shot backward closure that owns the tensors the rule
//! saved. `backward()` walks the nodes in reverse topological order, sums the gradients
//! reaching each node, and calls each closure once.
//!
//! The design decisions a reader must know:
//! - Backward rules are ordinary tensor ops, so backward builds lazy nodes and fuses like
//!   forward (a GELU backward and the bias-gradient's prologue become one kernel).
//! - The closure is taken when it runs, releasing its saved tensors at once; the graph does
//!   not survive `backward()` (a second call is an error that says so), and a forward that
//!   never calls `backward()` is released with its output.
//! - Leaves accumulate: a second `backward()` adds to `grad()`, until `zero_grad()`.
//! - A rule may hand on a gradient already taken through the activation that produced its
//!   input (`mark_activation`, `through_activation`): a linear layer reading a GELU's output
//!   computes the gradient at the GELU's input in its product's epilogue. The engine keeps
//!   such gradients apart and adds them after the activation's own rule has run on the rest.
//! - While a rule recorded with `record_taking_pending` runs, the engine offers it the
//!   gradient each input already has from its other consumers, or a leaf's accumulated one
//!   (`take_pending`); a rule that takes one adds it itself (a norm's backward inside its
//!   kernel: a residual stream's sum without a pass of its own; an embedding's into a tied
//!   head's gradient, in place).

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex};

use helios_kernels::Activation;
use rustc_hash::FxHashMap;

use crate::realize_lock::LockExt;
use crate::{Error, Result, Tensor};

/// The gradient of each input (`None` where it needs none), given the output's gradient and
/// which inputs need one.
pub(crate) type Backward = Box<dyn FnOnce(&Tensor, &[bool]) -> Result<Grads> + Send>;

/// A rule's gradients, one per input (`None` where it needs none): inline, since a step
/// runs hundreds of rules and most ops have one to three inputs.
pub(crate) type Grads = smallvec::SmallVec<[Option<Tensor>; 3]>;

/// Where the gradient of a tensor goes.
#[derive(Clone)]
pub(crate) enum GradLink {
    Leaf(Arc<LeafGrad>),
    Node(Arc<GradNode>),
}

impl GradLink {
    /// Whether both lead to the same leaf or node.
    fn same(&self, other: &GradLink) -> bool {
        match (self, other) {
            (GradLink::Leaf(a), GradLink::Leaf(b)) => Arc::ptr_eq(a, b),
            (GradLink::Node(a), GradLink::Node(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// A leaf's accumulated gradient.
pub(crate) struct LeafGrad {
    grad: Mutex<Option<Tensor>>,
}

/// One recorded op.
pub(crate) struct GradNode {
    name: &'static str,
    /// (inputs) where each input's gradient goes.
    /// Inline: most ops have one to three inputs, and a step records hundreds of nodes.
    edges: smallvec::SmallVec<[Option<GradLink>; 3]>,
    backward: Mutex<Option<Backward>>,
    /// An activation's node (see [`mark_activation`]): the activation and its input, so that
    /// the product consuming its output may compute the gradient at its input directly.
    act: Mutex<Option<(Activation, Tensor)>>,
    /// The rule may add its inputs' pending gradients itself ([`record_taking_pending`]):
    /// only such rules are offered them.
    takes_pending: bool,
}

impl GradNode {
    /// Whether every input's gradient goes to a leaf (or nowhere).
    fn feeds_only_leaves(&self) -> bool {
        self.edges
            .iter()
            .all(|e| !matches!(e, Some(GradLink::Node(_))))
    }
}

impl Drop for GradNode {
    fn drop(&mut self) {
        crate::lazy::LIVE_GRAD.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

thread_local! {
    static NO_GRAD: Cell<u32> = const { Cell::new(0) };
    /// While `backward()` runs on this thread: the address of its all-ones seed's node.
    static UNIT_SEED: Cell<usize> = const { Cell::new(0) };
    /// Node addresses of the gradients the running backward rule already took through an
    /// activation's derivative (see [`through_activation`]).
    static THROUGH_ACT: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// While a backward rule runs: per input, the gradient its other consumers already
    /// summed for it, which the rule may add itself ([`take_pending`]). A rule that runs a
    /// backward of its own (`checkpoint`) finds its list restored when that returns.
    static PENDING: RefCell<Vec<Option<Tensor>>> = const { RefCell::new(Vec::new()) };
    /// An empty list with capacity, for the next offer (no allocation a rule).
    static SPARE_OFFER: RefCell<Vec<Option<Tensor>>> = const { RefCell::new(Vec::new()) };
    /// The last backward's emptied work lists, for the next one (see [`Walk`]).
    static SPARE_WALK: RefCell<Walk> = RefCell::new(Walk::default());
}

/// The lists one `backward()` works in: the graph's nodes in order, the walk that orders
/// them, and the gradients summed per node. A training step walks the same ~500 nodes every
/// step; growing these from empty each time showed in profiles of the recording thread
/// (bench/results/source-comment-history.md). Taken from `SPARE_WALK` and put back emptied,
/// so a backward nested in a rule (`checkpoint`) only starts with empty ones.
#[derive(Default)]
struct Walk {
    order: Vec<Arc<GradNode>>,
    stack: Vec<(Arc<GradNode>, bool)>,
    seen: FxHashMap<*const GradNode, ()>,
    grads: FxHashMap<*const GradNode, Tensor>,
    through: FxHashMap<*const GradNode, Tensor>,
}

/// The gradient the other consumers of input `i` of the running backward rule's op have
/// already summed for it (for a leaf: all it has accumulated, earlier `backward()` calls
/// included), if there is one and `fits` accepts it (only for a rule recorded with
/// [`record_taking_pending`]). A rule that takes it
/// returns for input `i` its own gradient plus this one (a norm's backward adds it inside
/// its kernel), and the engine adds nothing; otherwise the engine sums the two as usual (a
/// pass over both; cost in bench/results/source-comment-history.md). Not for a gradient the
/// rule marks with [`through_activation`] (another sum).
pub(crate) fn take_pending(i: usize, fits: impl FnOnce(&Tensor) -> bool) -> Option<Tensor> {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let slot = p.get_mut(i)?;
        if slot.as_ref().is_some_and(fits) {
            TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            slot.take()
        } else {
            None
        }
    })
}

/// Pending gradients rules have taken ([`take_pending`]) since the process started.
static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many gradient sums backward rules have computed inside their own kernels so far
/// (process-wide; tests).
pub fn folded_gradient_sums() -> u64 {
    TAKEN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records that `out` is `act(input)`: a backward rule whose input `out` is (a linear
/// layer's product) may then compute the gradient at `input` itself, e.g. in its product's
/// epilogue, instead of the activation's rule making a pass over both tensors
/// ([`activation_input`], [`through_activation`]).
pub(crate) fn mark_activation(out: &Tensor, act: Activation, input: &Tensor) {
    if let Some(GradLink::Node(n)) = out.grad_link() {
        *n.act.locked() = Some((act, input.detach()));
    }
}

/// The activation and its input, where `link` is an activation's node (and it has not run).
pub(crate) fn activation_input(link: &GradLink) -> Option<(Activation, Tensor)> {
    match link {
        GradLink::Node(n) => n.act.locked().clone(),
        GradLink::Leaf(_) => None,
    }
}

/// Marks `g`, a gradient a backward rule returns for an input that is an activation's
/// output, as already multiplied by the activation's derivative: the engine passes it on to
/// the activation's input as it is, and applies the activation's rule only to the other
/// gradients that reach that output. (Exact however many consumers the output has:
/// act'(x)·(g₁ + g₂) = act'(x)·g₁ + act'(x)·g₂.)
pub(crate) fn through_activation(g: &Tensor) {
    THROUGH_ACT.with(|t| t.borrow_mut().push(g.node_addr()));
}

/// Whether `g` is the gradient of ones that [`Tensor::backward`] started from. A rule that
/// would multiply a saved gradient by `g` may return it as it is: cross-entropy's saved
/// gradient is as large as the logits (0.8 GB for GPT-2 at 8×1024 in bf16), and multiplying it
/// by 1 cost a full pass over it (bench/results/source-comment-history.md).
pub(crate) fn is_unit_seed(g: &Tensor) -> bool {
    UNIT_SEED.with(|s| s.get() == g.node_addr())
}

/// Marks `seed` as the unit seed until dropped.
struct UnitSeed;

impl UnitSeed {
    fn mark(seed: &Tensor) -> UnitSeed {
        UNIT_SEED.with(|s| s.set(seed.node_addr()));
        UnitSeed
    }
}

impl Drop for UnitSeed {
    fn drop(&mut self) {
        UNIT_SEED.with(|s| s.set(0));
    }
}

/// While alive, ops on this thread record no gradients (see [`no_grad`]).
pub struct NoGradGuard(());

impl NoGradGuard {
    pub fn new() -> NoGradGuard {
        NO_GRAD.with(|c| c.set(c.get() + 1));
        NoGradGuard(())
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        NoGradGuard::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD.with(|c| c.set(c.get() - 1));
    }
}

/// Runs `f` without recording gradients (evaluation, optimizer updates).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

fn grad_enabled() -> bool {
    NO_GRAD.with(|c| c.get() == 0)
}

/// Records gradients again while alive, inside a `no_grad` region (restores it on drop).
struct EnableGradGuard(u32);

impl EnableGradGuard {
    fn new() -> EnableGradGuard {
        EnableGradGuard(NO_GRAD.with(|c| c.replace(0)))
    }
}

impl Drop for EnableGradGuard {
    fn drop(&mut self) {
        NO_GRAD.with(|c| c.set(self.0));
    }
}

/// Gradient checkpointing: `f(inputs)` computed without keeping anything for backward but
/// the inputs themselves; `backward()` runs `f` again, recording, and backpropagates through
/// that. Trades one more forward of `f` for its saved intermediates (e.g. the (B, H, T, T)
/// probabilities of materialised attention). `f` must compute the same values each time
/// (every Helios kernel is deterministic).
pub fn checkpoint(
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor> + Send + 'static,
) -> Result<Tensor> {
    let detached: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
    let out = no_grad(|| f(&detached))?;
    if !any_needs(inputs) {
        return Ok(out);
    }
    Ok(record("checkpoint", inputs, out, move |g, needs| {
        let _record = EnableGradGuard::new();
        let leaves: Vec<Tensor> = detached
            .iter()
            .zip(needs)
            .map(|(t, &n)| if n { t.requires_grad_() } else { t.clone() })
            .collect();
        drop(detached);
        let y = f(&leaves)?;
        if !y.requires_grad() {
            // `f` ignored every input that needs a gradient.
            return Ok(smallvec::smallvec![None; leaves.len()]);
        }
        y.backward_with(g)?;
        Ok(leaves
            .iter()
            .zip(needs)
            .map(|(l, &n)| if n { l.grad() } else { None })
            .collect())
    }))
}

/// `out`, linked to `inputs` through `backward` when any input needs a gradient and
/// gradients are being recorded.
pub(crate) fn record(
    name: &'static str,
    inputs: &[&Tensor],
    out: Tensor,
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Grads> + Send + 'static,
) -> Tensor {
    record_node(name, inputs, out, false, backward)
}

/// `record` for a rule that calls [`take_pending`]: while it runs, the engine offers it the
/// gradient each input already has (others pay nothing for the offer).
pub(crate) fn record_taking_pending(
    name: &'static str,
    inputs: &[&Tensor],
    out: Tensor,
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Grads> + Send + 'static,
) -> Tensor {
    record_node(name, inputs, out, true, backward)
}

fn record_node(
    name: &'static str,
    inputs: &[&Tensor],
    out: Tensor,
    takes_pending: bool,
    backward: impl FnOnce(&Tensor, &[bool]) -> Result<Grads> + Send + 'static,
) -> Tensor {
    if !grad_enabled() || inputs.iter().all(|t| t.grad_link().is_none()) {
        return out;
    }
    crate::lazy::LIVE_GRAD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let node = GradNode {
        name,
        edges: inputs.iter().map(|t| t.grad_link().cloned()).collect(),
        backward: Mutex::new(Some(Box::new(backward))),
        act: Mutex::new(None),
        takes_pending,
    };
    out.with_grad(Some(GradLink::Node(Arc::new(node))))
}

/// Whether any of `inputs` needs a gradient (rules save tensors only then).
pub(crate) fn any_needs(inputs: &[&Tensor]) -> bool {
    inputs.iter().any(|t| t.grad_link().is_some()) && grad_enabled()
}

impl Tensor {
    /// This tensor as a leaf that accumulates a gradient (`grad()` after `backward()`).
    pub fn requires_grad_(&self) -> Tensor {
        self.with_grad(Some(GradLink::Leaf(Arc::new(LeafGrad {
            grad: Mutex::new(None),
        }))))
    }

    /// Whether gradients flow back from this tensor.
    pub fn requires_grad(&self) -> bool {
        self.grad_link().is_some()
    }

    /// Whether this tensor is a leaf that accumulates its gradient.
    pub fn is_leaf(&self) -> bool {
        matches!(self.grad_link(), Some(GradLink::Leaf(_)))
    }

    /// The same values, cut from the graph: no gradient flows through the result.
    pub fn detach(&self) -> Tensor {
        self.with_grad(None)
    }

    /// The gradient accumulated in this leaf (`None` before any `backward()` reached it, or
    /// for a tensor that is not a leaf).
    pub fn grad(&self) -> Option<Tensor> {
        match self.grad_link() {
            Some(GradLink::Leaf(l)) => l.grad.locked().clone(),
            _ => None,
        }
    }

    /// Forgets this leaf's accumulated gradient.
    pub fn zero_grad(&self) {
        if let Some(GradLink::Leaf(l)) = self.grad_link() {
            *l.grad.locked() = None;
        }
    }

    /// Replaces this leaf's accumulated gradient (e.g. after clipping).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        match self.grad_link() {
            Some(GradLink::Leaf(l)) => {
                *l.grad.locked() = grad.map(|g| g.detach());
                Ok(())
            }
            _ => Err(Error::Invalid {
                op: "set_grad",
                detail: "only a leaf (requires_grad_) holds a gradient".into(),
            }),
        }
    }

    /// Backpropagates from this one-element tensor (a loss), as if its gradient were 1.
    pub fn backward(&self) -> Result<()> {
        if self.len() != 1 {
            return Err(Error::Invalid {
                op: "backward",
                detail: format!(
                    "backward() needs a one-element tensor (a loss); this one has shape {:?}: \
                     reduce it first or call backward_with(gradient)",
                    self.shape()
                ),
            });
        }
        let one = Tensor::full(self.device(), self.shape(), 1.0, self.dtype())?;
        let _unit = UnitSeed::mark(&one);
        self.backward_with(&one)
    }

    /// Backpropagates `grad` (of this tensor's shape) through the graph that made this
    /// tensor, adding to the leaves' gradients.
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        if grad.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "backward",
                lhs: self.shape().to_vec(),
                rhs: grad.shape().to_vec(),
            });
        }
        let grad = grad.detach();
        let _no_grad = NoGradGuard::new();
        match self.grad_link() {
            None => Err(Error::Invalid {
                op: "backward",
                detail: "this tensor does not depend on any tensor that requires a gradient; \
                         mark parameters with requires_grad_()"
                    .into(),
            }),
            Some(GradLink::Leaf(l)) => accumulate(l, grad),
            Some(GradLink::Node(n)) => run_backward(n, grad),
        }
    }
}

fn accumulate(leaf: &LeafGrad, g: Tensor) -> Result<()> {
    // A gradient that reached the leaf through a transpose (a tied output head's: 50304×768
    // for GPT-2) is made row-major here, by the tiled transpose: added to another gradient
    // or read by the optimizer as it is, it would be gathered element by element, several
    // times slower than the transpose and a dense add (bench/results/source-comment-history.md).
    let g = match g.transposed_matrices() {
        Some(_) => g.contiguous()?,
        None => g,
    };
    // A pending product (a weight's gradient) is recorded now, with the sum of an earlier
    // gradient as its residual where there is one: left for the optimizer step, it would
    // hold its operands (an activation and a gradient of this step) until then.
    let record = g.is_pending_product();
    let mut slot = leaf.grad.locked();
    let sum = match slot.take() {
        Some(old) => old.add(&g)?,
        None => g,
    };
    let sum = slot.insert(sum);
    if record {
        sum.realize()?;
    }
    Ok(())
}

/// The nodes reachable from `root`, each after every node that feeds it a gradient.
fn topological(root: &Arc<GradNode>, walk: &mut Walk) {
    let Walk {
        order, stack, seen, ..
    } = walk;
    stack.push((root.clone(), false));
    while let Some((n, expanded)) = stack.pop() {
        if expanded {
            order.push(n);
            continue;
        }
        if seen.insert(Arc::as_ptr(&n), ()).is_some() {
            continue;
        }
        // The node, then its inputs above it (no list of them: one allocation a node). Inputs
        // whose gradients go only to leaves (a view of a weight, as a tied head's transpose)
        // go first, so they are walked last and run as soon as their gradient is whole: their
        // pending gradient (a weight's product) then stops holding its operands, and a later
        // rule of the same leaf finds it accumulated (`take_pending`).
        let at = stack.len();
        stack.push((n, true));
        for sinks in [true, false] {
            for i in 0..stack[at].0.edges.len() {
                if let Some(GradLink::Node(c)) = &stack[at].0.edges[i] {
                    if c.feeds_only_leaves() == sinks && !seen.contains_key(&Arc::as_ptr(c)) {
                        let c = c.clone();
                        stack.push((c, false));
                    }
                }
            }
        }
    }
    seen.clear();
    // Post-order puts inputs first; backward runs outputs first.
    order.reverse();
}

fn run_backward(root: &Arc<GradNode>, seed: Tensor) -> Result<()> {
    let mut walk = SPARE_WALK.with(|w| std::mem::take(&mut *w.borrow_mut()));
    let result = walk_backward(root, seed, &mut walk);
    walk.order.clear();
    walk.grads.clear();
    walk.through.clear();
    SPARE_WALK.with(|w| *w.borrow_mut() = walk);
    result
}

/// `run_backward` in `walk`'s lists.
fn walk_backward(root: &Arc<GradNode>, seed: Tensor, walk: &mut Walk) -> Result<()> {
    topological(root, walk);
    let Walk {
        order,
        grads,
        through,
        ..
    } = walk;
    grads.insert(Arc::as_ptr(root), seed);
    // Inputs of the running rule whose pending gradient it took (`take_pending`).
    let mut taken: smallvec::SmallVec<[*const GradNode; 4]> = smallvec::SmallVec::new();
    for node in order.drain(..) {
        taken.clear();
        let backward = node.backward.locked().take();
        let Some(backward) = backward else {
            return Err(Error::Invalid {
                op: "backward",
                detail: format!(
                    "the graph through `{}` was already used by an earlier backward() and \
                     released; run the forward pass again",
                    node.name
                ),
            });
        };
        let key = Arc::as_ptr(&node);
        node.act.locked().take();
        let (g, done) = (grads.remove(&key), through.remove(&key));
        // A node no gradient reached (its output was unused) only releases its tensors.
        if g.is_none() && done.is_none() {
            continue;
        }
        let needs: smallvec::SmallVec<[bool; 4]> = node.edges.iter().map(Option::is_some).collect();
        THROUGH_ACT.with(|t| t.borrow_mut().clear());
        let mut input_grads = match g {
            Some(g) if node.takes_pending => {
                run_offering(&node, backward, &g, &needs, grads, &mut taken)?
            }
            Some(g) => backward(&g, &needs)?,
            None => smallvec::smallvec![None; needs.len()],
        };
        let marked = THROUGH_ACT.with(|t| std::mem::take(&mut *t.borrow_mut()));
        if let Some(done) = done {
            // An activation: its one input's gradient, part of it computed by its consumers.
            input_grads[0] = Some(match input_grads[0].take() {
                Some(rest) => rest.add(&done)?,
                None => done,
            });
        }
        for (edge, ig) in node.edges.iter().zip(input_grads) {
            let (Some(edge), Some(ig)) = (edge, ig) else {
                continue;
            };
            match edge {
                GradLink::Leaf(l) => accumulate(l, ig)?,
                GradLink::Node(n) => {
                    let key = Arc::as_ptr(n);
                    let map = match marked.contains(&ig.node_addr()) {
                        true if activation_input(edge).is_none() => {
                            return Err(Error::Invalid {
                                op: "backward",
                                detail: format!(
                                    "`{}` passed on a gradient taken through an activation \
                                     to an input that is no activation's output (a bug)",
                                    node.name
                                ),
                            })
                        }
                        true if taken.contains(&key) => {
                            return Err(Error::Invalid {
                                op: "backward",
                                detail: format!(
                                    "`{}` took its input's pending gradient and passed it on \
                                     through an activation (a bug)",
                                    node.name
                                ),
                            })
                        }
                        true => &mut *through,
                        false => &mut *grads,
                    };
                    let sum = match map.remove(&key) {
                        Some(old) => old.add(&ig)?,
                        None => ig,
                    };
                    map.insert(key, sum);
                }
            }
        }
    }
    Ok(())
}

/// Runs `node`'s rule `backward` offering it each input's gradient summed so far in `grads`
/// (the first edge to a node only: an op may read one tensor twice); what it does not take
/// goes back into `grads`, what it takes is listed in `taken`.
fn run_offering(
    node: &GradNode,
    backward: Backward,
    g: &Tensor,
    needs: &[bool],
    grads: &mut FxHashMap<*const GradNode, Tensor>,
    taken: &mut smallvec::SmallVec<[*const GradNode; 4]>,
) -> Result<Grads> {
    let mut offered = SPARE_OFFER.with(|p| std::mem::take(&mut *p.borrow_mut()));
    offered.clear();
    // Each input's gradient once (an input passed twice is offered at its first place); a
    // leaf's is what it has accumulated so far.
    offered.extend(node.edges.iter().enumerate().map(|(i, e)| {
        let e = e.as_ref()?;
        if node.edges[..i].iter().flatten().any(|f| f.same(e)) {
            return None;
        }
        match e {
            GradLink::Node(n) => grads.remove(&Arc::as_ptr(n)),
            GradLink::Leaf(l) => l.grad.locked().take(),
        }
    }));
    let offered_any: smallvec::SmallVec<[bool; 4]> = offered.iter().map(Option::is_some).collect();
    // Swapped in and out: an enclosing rule's list (a checkpoint's backward runs this loop
    // inside its rule) comes back untouched.
    let outer = PENDING.with(|p| std::mem::replace(&mut *p.borrow_mut(), offered));
    let result = backward(g, needs);
    let mut left = PENDING.with(|p| std::mem::replace(&mut *p.borrow_mut(), outer));
    for ((e, back), offered) in node.edges.iter().zip(left.drain(..)).zip(offered_any) {
        match (e, back) {
            (Some(GradLink::Node(n)), Some(t)) => {
                grads.insert(Arc::as_ptr(n), t);
            }
            (Some(GradLink::Leaf(l)), Some(t)) => {
                *l.grad.locked() = Some(t);
            }
            (Some(GradLink::Node(n)), None) if offered => {
                // Taken: the rule's gradient includes it (and must not be one taken through
                // an activation, which would be summed apart).
                taken.push(Arc::as_ptr(n));
            }
            _ => {}
        }
    }
    SPARE_OFFER.with(|p| *p.borrow_mut() = left);
    result
}

/// `g` summed over the dimensions along which `shape` was broadcast to `g`'s shape.
pub(crate) fn reduce_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let mut t = g.clone();
    let pad = t.shape().len() - shape.len();
    if pad > 1 {
        // The leading dimensions as one, summed by one reduction (a bias's gradient over
        // (B, T, n) reads g once instead of writing a (T, n) partial), where the view merges
        // them in place; otherwise one at a time below.
        let mut merged = vec![g.shape()[..pad].iter().product::<usize>()];
        merged.extend_from_slice(&g.shape()[pad..]);
        if g.layout().reshape(&merged).is_some() {
            t = g.reshape(&merged)?;
        }
    }
    while t.shape().len() > shape.len() {
        t = t.sum(0)?;
    }
    for d in 0..shape.len() {
        if shape[d] == 1 && t.shape()[d] != 1 {
            let mut keep = t.shape().to_vec();
            keep[d] = 1;
            t = t.sum(d as isize)?.reshape(&keep)?;
        }
    }
    Ok(t)
}
