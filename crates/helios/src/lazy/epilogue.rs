//! Matrix products in the lazy graph: their recording, and the scheduler's pass that folds
//! the element-wise ops reading a product into the matmul kernel's epilogue.
//!
//! A product built with at most a bias and an activation (`Tensor::matmul_raw`) is a pending
//! node whose op, `ElemOp::Product`, holds its operands, realised when it was built. `collect`
//! never takes it into a fusion group. It is recorded the first time something needs it:
//! - a library kernel, a host read or an optimizer step: as it was asked for
//!   (`realize_product`);
//! - a fusion group reading it: `collect` finds it among the group's prerequisites and
//!   asks `fold_target` how much of the group the epilogue can compute. Those members (the
//!   *tail*) follow one another, each reading the one before element for element, in the
//!   epilogue's order:
//!   1. `× s` or `/ s`, folded into the product's scale;
//!   2. `+ bias`, a vector broadcast along the rows;
//!   3. GELU (tanh) or ReLU; or instead the gradient at an activation's input,
//!      `act_backward(x, product)`, which reads `x` where the epilogue reads a residual;
//!   4. `+ residual`, a dense tensor of the output's shape;
//!   5. a cast, where no bias or residual is read (they would need converting first).
//!
//!   Every member of the tail but the last is read by the next alone and held by nothing
//!   else, except an activation's input, which the kernel then stores beside its output
//!   (autograd holds it for the activation's backward). The last is stored by the product,
//!   as if by its own kernel; `fold` records the product with that epilogue, and the rest of
//!   the group, collected again, reads the stored result.
//!
//! So `x.matmul(&w)?.add(&b)?.gelu_tanh()?` runs the kernel `matmul_opts` with a bias and an
//! activation would: one dispatch, where it was two (the product, then a fused kernel
//! rereading it).
//!
//! Activations and their gradients fold only into f32 products. In f16/bf16 the cooperative
//! kernels run the epilogue while the matrix units idle, so the GELU's gradient in the
//! product cost more than a separate pass (bench/results/source-comment-history.md; the
//! reason `autograd_ops::matmul` keeps them apart too).
//!
//! The design decision a reader must know: the product is recorded under the scheduler's
//! lock, so nothing it does may build or realise a graph node. Its operands were realised
//! when it was built, and the tail admits only a bias and a residual that are dense and of
//! the output's dtype, which the product then reads as they are (`Tensor::product_now`).

use std::sync::Arc;

use helios_kernels::{Activation, BinaryOp, UnaryOp};
use helios_vk::MemoryLocation;
use smallvec::SmallVec;

use super::group::{dense_edge, take_prerequisites, Group};
use super::recycle::recycle;
use super::stats::{report, Realised};
use super::{realize, ElemOp, Input, Node, Pending};
use crate::ops::MatmulSpec;
use crate::realize_lock::Realizing;
use crate::{DType, Layout, Result, Tensor};

/// A pending product's epilogue as it was built, and its operands' dtype.
struct ProductOp {
    alpha: f32,
    act: Activation,
    bias: bool,
    input: DType,
}

/// `p`'s op, if `p` is a pending product (read and put back).
fn product_op(p: &Node, lock: &Realizing) -> Option<ProductOp> {
    let pending = p.pending.take(lock)?;
    let op = match pending.op {
        ElemOp::Product { alpha, act, bias } => Some(ProductOp {
            alpha,
            act,
            bias,
            input: pending.inputs[0].node.dtype,
        }),
        _ => None,
    };
    p.pending.replace(Some(pending), lock);
    op
}

/// Where the activation's input is stored when something besides the activation holds it.
#[derive(Clone, Copy, Debug)]
enum Pre {
    Product,
    /// A member of the tail (topological index).
    Member(usize),
}

/// The epilogue a product takes from a group reading it (`tail`).
struct Tail {
    /// The members it computes, in order (topological indices); the last is stored.
    members: SmallVec<[usize; 4]>,
    alpha: f32,
    /// The product was built with a bias.
    own_bias: bool,
    /// A bias from the group.
    bias: Option<Tensor>,
    act: Activation,
    pre: Option<Pre>,
    /// The residual, or the activation's input for `act_grad`.
    residual: Option<Tensor>,
    act_grad: Activation,
    out: DType,
}

/// One member of a tail, as the epilogue computes it.
enum Stage {
    Scale(f32),
    Bias(Tensor),
    Act(Activation),
    ActGrad(Activation, Tensor),
    Residual(Tensor),
    Cast(DType),
}

impl Tail {
    /// The epilogue product `op` was built with (output `out`), taking nothing of a group yet.
    fn new(op: &ProductOp, out: DType) -> Tail {
        Tail {
            members: SmallVec::new(),
            alpha: op.alpha,
            own_bias: op.bias,
            bias: None,
            act: op.act,
            pre: None,
            residual: None,
            act_grad: Activation::None,
            out,
        }
    }

    fn has_bias(&self) -> bool {
        self.own_bias || self.bias.is_some()
    }

    /// Nothing applied yet after the scale.
    fn bare(&self) -> bool {
        !self.has_bias() && self.act == Activation::None && self.after_act_free()
    }

    /// Nothing applied yet that must come after an activation.
    fn after_act_free(&self) -> bool {
        self.residual.is_none() && self.act_grad == Activation::None
    }

    fn apply(&mut self, stage: Stage) {
        match stage {
            Stage::Scale(s) => self.alpha *= s,
            Stage::Bias(b) => self.bias = Some(b),
            Stage::Act(a) => self.act = a,
            Stage::ActGrad(a, x) => {
                self.act_grad = a;
                self.residual = Some(x);
            }
            Stage::Residual(r) => self.residual = Some(r),
            Stage::Cast(d) => self.out = d,
        }
    }
}

/// The tail of group `g` that product `p` can compute in its epilogue (`None`: not even its
/// first reader). `refs`: the references to `p` the scheduler holds itself (its
/// prerequisite lists), beside the one reading member's input.
fn tail(g: &Group<'_>, p: &Arc<Node>, refs: usize, lock: &Realizing) -> Option<Tail> {
    let op = product_op(p, lock)?;
    let reads = (0..g.len())
        .flat_map(|j| g.op(j).inputs.iter())
        .filter(|i| Arc::ptr_eq(&i.node, p))
        .count();
    if reads != 1 {
        return None;
    }
    let shape = p.layout.shape();
    let mut t = Tail::new(&op, p.dtype);
    // The value computed last (the product, then each member taken), whether something
    // other than its one reader holds it, and its member index.
    let (mut value, mut held, mut at) = (p, Arc::strong_count(p) > 1 + refs, None);
    loop {
        let from = at.map_or(0, |j: usize| j + 1);
        let found = (from..g.len()).find_map(|j| {
            let inputs = &g.op(j).inputs;
            let slot = inputs.iter().position(|i| Arc::ptr_eq(&i.node, value))?;
            Some((j, slot))
        });
        let Some((j, slot)) = found else { break };
        let (m, o) = (g.node(j), g.op(j));
        if !dense_edge(&o.inputs[slot], m.len) {
            break;
        }
        let Some(stage) = stage(g, &t, o, slot, m, shape, op.input) else {
            break;
        };
        match (&stage, held) {
            // A held value is stored: only an activation's input can be, beside its output.
            (Stage::Act(_), true) => t.pre = Some(at.map_or(Pre::Product, Pre::Member)),
            (_, true) => break,
            _ => {}
        }
        let last = matches!(stage, Stage::Cast(_)) || t.pre.is_some();
        t.apply(stage);
        t.members.push(j);
        if last || j + 1 == g.len() || g.uses(m) != 1 {
            break;
        }
        (value, held, at) = (m, g.held_outside(j) > 0, Some(j));
    }
    (!t.members.is_empty()).then_some(t)
}

/// How the epilogue computes member `m` (op `o`, reading the tail's value at input `slot`),
/// given what `t` holds so far; `None` if it cannot.
fn stage(
    g: &Group<'_>,
    t: &Tail,
    o: &Pending,
    slot: usize,
    m: &Node,
    shape: &[usize],
    input: DType,
) -> Option<Stage> {
    // An operand the epilogue reads besides the product: stored or to be stored first (not
    // computed in this group), dense, of the output's shape (read as such).
    let operand = |x: &Input| {
        (g.member(&x.node).is_none() && dense_edge(x, m.len))
            .then(|| Tensor::from_parts(x.node.clone(), Some(Layout::contiguous(shape))))
    };
    let f32_act = input == DType::F32 && t.act == Activation::None && t.after_act_free();
    match o.op {
        ElemOp::Scalar {
            op: BinaryOp::Mul,
            s,
            ..
        } if t.bare() => Some(Stage::Scale(s)),
        // `p / s` as `p · (1/s)`: within an ulp of the division (attention's `/ √d`).
        ElemOp::Scalar {
            op: BinaryOp::Div,
            s,
            scalar_first: false,
        } if t.bare() => Some(Stage::Scale(1.0 / s)),
        ElemOp::Binary(BinaryOp::Add) => {
            let x = &o.inputs[1 - slot];
            if g.member(&x.node).is_some() {
                return None;
            }
            let n = *shape.last()?;
            if t.bare() && is_bias(x, m, n) {
                let b = Tensor::from_parts(x.node.clone(), Some(Layout::contiguous(&[n])));
                return Some(Stage::Bias(b));
            }
            t.after_act_free()
                .then(|| operand(x))
                .flatten()
                .map(Stage::Residual)
        }
        ElemOp::Unary(UnaryOp::GeluTanh) if f32_act => Some(Stage::Act(Activation::GeluTanh)),
        ElemOp::Unary(UnaryOp::Relu) if f32_act => Some(Stage::Act(Activation::Relu)),
        ElemOp::Binary(b @ (BinaryOp::GeluTanhBackward | BinaryOp::ReluBackward))
            if slot == 1 && f32_act && !t.has_bias() =>
        {
            let act = match b {
                BinaryOp::GeluTanhBackward => Activation::GeluTanh,
                _ => Activation::Relu,
            };
            operand(&o.inputs[0]).map(|x| Stage::ActGrad(act, x))
        }
        ElemOp::Cast if !t.has_bias() && t.residual.is_none() => Some(Stage::Cast(m.dtype)),
        _ => None,
    }
}

/// Whether `x`, added to member `m` (whose rows are `n` long), is a bias: a dense vector of
/// `n` values from the start of its node, broadcast along the rows.
fn is_bias(x: &Input, m: &Node, n: usize) -> bool {
    let row = |l: &Layout| l.shape().last() == Some(&n);
    row(&m.layout) && matches!(&x.view, Some(l) if l.is_dense() && l.len() == n && row(l))
}

/// A pending product among `pre`, the prerequisites of group `g`, that can compute a tail of
/// the group in its epilogue: (the tail's last member, the product).
pub(super) fn fold_target(
    g: &Group<'_>,
    pre: &[Arc<Node>],
    lock: &Realizing,
) -> Option<(Arc<Node>, Arc<Node>)> {
    pre.iter().enumerate().find_map(|(i, p)| {
        if !p.is_pending_product() || pre[..i].iter().any(|q| Arc::ptr_eq(q, p)) {
            return None;
        }
        let refs = pre.iter().filter(|q| Arc::ptr_eq(q, p)).count();
        let t = tail(g, p, refs, lock)?;
        Some((g.node(*t.members.last()?).clone(), p.clone()))
    })
}

/// Realises `end`, the last member of a tail product `p` computes (`fold_target`): the
/// tail's other prerequisites first (a bias or residual still pending), then the product
/// with the tail as its epilogue, storing `end` (and the activation's input where held).
/// If the group at `end` is no longer such a tail, `p` is recorded as it is.
pub(super) fn fold(end: &Arc<Node>, p: Arc<Node>, lock: &Realizing) -> Result<()> {
    let (mut g, t) = loop {
        if end.is_realized() || !p.is_pending_product() {
            return Ok(());
        }
        let mut g = Group::new(end, lock);
        let pre = take_prerequisites(&mut g);
        if pre.iter().all(|q| Arc::ptr_eq(q, &p)) {
            let whole =
                |t: &Tail| t.members.len() == g.len() && t.members.last() == Some(&(g.len() - 1));
            match tail(&g, &p, 1 + pre.len(), lock) {
                Some(t) if whole(&t) => break (g, t),
                _ => {
                    drop(g);
                    return realize_product(&p, MemoryLocation::DeviceLocal, lock);
                }
            }
        }
        drop(g);
        for q in pre.iter().filter(|q| !Arc::ptr_eq(q, &p)) {
            realize(q, MemoryLocation::DeviceLocal, lock)?;
        }
    };
    let (out, pre, kernel) = record(&p, &t, MemoryLocation::DeviceLocal, lock)?;
    set_buffer(end, out);
    if let (Some(node), Some(pre)) = (stored_pre(&g, &p, t.pre), pre) {
        set_buffer(node, pre);
    }
    report(Realised::Epilogue {
        kernel: &kernel,
        group: &g,
        end,
    });
    let members = g.release();
    recycle(members, lock);
    Ok(())
}

/// Records pending product `p` with `t`'s epilogue, its output in `location`: the output,
/// the activation's input where `t` stores it, and the kernel's name (`product_now`). The op
/// is dropped once recorded; on an error `p` keeps it, pending as before.
fn record(
    p: &Node,
    t: &Tail,
    location: MemoryLocation,
    lock: &Realizing,
) -> Result<(Tensor, Option<Tensor>, String)> {
    // A product loses its op only when recorded, or folded into its one reader (then
    // nothing else held it): a pending one asked for here still has it.
    let op = p
        .pending
        .take(lock)
        .expect("a pending product keeps its op until it is recorded");
    let (a, b, own_bias) = operands(&op);
    let opts = MatmulSpec {
        alpha: t.alpha,
        bias: own_bias.as_ref().or(t.bias.as_ref()),
        act: t.act,
        residual: t.residual.as_ref(),
        act_grad: t.act_grad,
        out: Some(t.out),
        ..Default::default()
    };
    let recorded = a.product_now(&b, &opts, t.pre.is_some(), location);
    if recorded.is_err() {
        p.pending.replace(Some(op), lock);
    }
    recorded
}

/// Hands `tensor`'s buffer (a fresh output of `record`) to `node`, which it realises.
fn set_buffer(node: &Node, tensor: Tensor) {
    let buffer = tensor
        .into_buffer()
        .expect("a fresh output is held nowhere else");
    let _ = node.buffer.set(buffer);
}

/// The node the activation's input is stored into.
fn stored_pre<'g>(g: &'g Group<'_>, p: &'g Arc<Node>, pre: Option<Pre>) -> Option<&'g Arc<Node>> {
    match pre? {
        Pre::Product => Some(p),
        Pre::Member(j) => Some(g.node(j)),
    }
}

/// A product op's operands: a, b and the bias it was built with.
fn operands(op: &Pending) -> (Tensor, Tensor, Option<Tensor>) {
    let tensor = |i: &Input| Tensor::from_parts(i.node.clone(), i.view.clone());
    let bias = op.inputs.get(2).map(tensor);
    (tensor(&op.inputs[0]), tensor(&op.inputs[1]), bias)
}

/// Records pending product `p` as it was built, its output in `location`.
pub(super) fn realize_product(
    p: &Arc<Node>,
    location: MemoryLocation,
    lock: &Realizing,
) -> Result<()> {
    let Some(op) = product_op(p, lock) else {
        unreachable!("a pending product keeps its op until it is recorded")
    };
    let (out, _, kernel) = record(p, &Tail::new(&op, p.dtype), location, lock)?;
    set_buffer(p, out);
    report(Realised::Product {
        kernel: &kernel,
        out: p,
    });
    Ok(())
}
