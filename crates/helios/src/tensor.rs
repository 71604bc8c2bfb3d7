//! `Tensor`: an immutable array on a device, and its element-wise operations.
//!
//! A tensor is a `Layout` (shape, strides, offset) over a node of the lazy graph (`lazy`),
//! which is either realised (a buffer) or pending (an op not yet run); views share the node
//! and cost no GPU work (`view.rs`). Elements are stored as the tensor's `DType` (f32, f16 or
//! bf16); kernels compute in f32.
//!
//! Element-wise ops run nothing when called: each adds a pending node (operands broadcast
//! numpy-style, output row-major), and the scheduler fuses a chain of them into one kernel
//! when a value is needed (`to_vec`, `realize`, a library kernel that reads the buffer).
//! Library ops (`ops/`) record their kernels into the device's open batch when called; a
//! matmul may stay pending instead, so that the element-wise ops after it join its epilogue.
//! Only a read-back (or `Device::synchronize`) waits for the GPU, and `to_vec` waits only for
//! the work that writes the tensor. The one kernel this file records itself is the copy that
//! reads a strided or small tensor straight into host memory.

use std::borrow::Cow;
use std::sync::Arc;

use helios_kernels::{
    BinaryOp, Compare, ElementwiseAddresses, ElementwiseOp, Geometry, Strides, UnaryOp, MAX_DIMS,
};
use helios_spirv::Binding;
use helios_vk::{Access, Buffer, MemoryLocation};

use crate::device::{KernelKey, OperandLayout};
use crate::grad_rules::{self, Saved};
use crate::layout::{broadcast_shapes, merge_dims, Layout};
use crate::lazy::{ElemOp, Input, Node};
use crate::{DType, Device, Error, Result};

/// An n-dimensional array on a device, stored as `dtype` (arithmetic is f32). Cloning is
/// cheap (reference counts); views share the node (and, once it is realised, the buffer).
///
/// The handle holds its parts inline rather than behind one more `Arc`: every op makes a
/// tensor, and an allocation per op is a large share of building a lazy chain.
#[derive(Clone)]
pub struct Tensor {
    /// The array this tensor views: realised (a buffer) or pending (a lazy op).
    node: Arc<Node>,
    /// The view, or `None`: the whole array in its own row-major layout (`Node::layout`).
    /// Most tensors are that, and then make or drop no reference count for a layout.
    view: Option<Layout>,
    /// Autograd: how the gradient flows back from this tensor (`None`: it needs none).
    grad: Option<crate::autograd::GradLink>,
}

impl Tensor {
    /// Copies `data` to `device` as an f32 tensor of `shape` (whose product must be
    /// `data.len()`).
    pub fn from_slice(device: &Device, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice_as(device, data, shape, DType::F32)
    }

    /// Copies `data` to `device` as a tensor of `dtype` (values are rounded to it).
    pub fn from_slice_as(
        device: &Device,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        let t = Tensor::empty(device, shape, dtype)?;
        if !data.is_empty() {
            device
                .context()
                .upload(t.buffer()?, 0, &dtype.encode(data))?;
        }
        Ok(t)
    }

    /// A 1-D f32 tensor holding `data`.
    pub fn from_vec1(device: &Device, data: &[f32]) -> Result<Tensor> {
        Tensor::from_slice(device, data, &[data.len()])
    }

    /// A dense tensor of `shape` whose contents are undefined until a kernel writes them.
    pub(crate) fn empty(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::empty_in(device, shape, dtype, MemoryLocation::DeviceLocal)
    }

    /// `empty`, its buffer in `location`.
    pub(crate) fn empty_in(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        location: MemoryLocation,
    ) -> Result<Tensor> {
        let len: usize = shape.iter().product();
        let bytes = (len * dtype.size()) as u64;
        let buffer = device.context().create_buffer(bytes, location)?;
        Ok(Tensor::from_buffer(device, buffer, shape, dtype))
    }

    /// A realised row-major tensor of `shape` whose elements are `buffer`'s first bytes
    /// (the caller checked that it holds them).
    pub(crate) fn from_buffer(
        device: &Device,
        buffer: Buffer,
        shape: &[usize],
        dtype: DType,
    ) -> Tensor {
        let layout = Layout::contiguous(shape);
        Tensor::from_node(Node::realized(device.clone(), dtype, &layout, buffer))
    }

    /// The address of the array this tensor views: equal for tensors viewing the same one.
    pub(crate) fn node_addr(&self) -> usize {
        Arc::as_ptr(&self.node) as usize
    }

    /// A tensor viewing the whole of `node`.
    fn from_node(node: Arc<Node>) -> Tensor {
        Tensor {
            node,
            view: None,
            grad: None,
        }
    }

    /// A tensor viewing `node` through `view` (`None`: the whole node), with no autograd
    /// link: the scheduler's handle on a graph node.
    pub(crate) fn from_parts(node: Arc<Node>, view: Option<Layout>) -> Tensor {
        match view {
            Some(layout) if !layout.same(&node.layout) => Tensor {
                node,
                view: Some(layout),
                grad: None,
            },
            _ => Tensor::from_node(node),
        }
    }

    /// The graph node and view this tensor reads, as a pending op's input.
    pub(crate) fn input(&self) -> Input {
        Input {
            node: self.node.clone(),
            view: Some(self.layout().clone()),
        }
    }

    /// The buffer of a tensor nothing else refers to (a scheduler's temporary), handed over;
    /// `None` if the array is shared or not realised.
    pub(crate) fn into_buffer(self) -> Option<Buffer> {
        let mut node = Arc::try_unwrap(self.node).ok()?;
        node.take_buffer()
    }

    /// Whether this tensor is a matrix product still waiting in the lazy graph (see
    /// `lazy::epilogue`).
    pub(crate) fn is_pending_product(&self) -> bool {
        self.node.is_pending_product()
    }

    /// Whether this tensor is the whole of its array and the only reference to it (no other
    /// tensor, view or pending op reads it): a kernel may then overwrite the array in place.
    pub(crate) fn owns_array(&self) -> bool {
        self.view.is_none() && Arc::strong_count(&self.node) == 1
    }

    /// Another view of this tensor's array (no autograd link: view ops add their own).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            view: (!layout.same(&self.node.layout)).then_some(layout),
            node: self.node.clone(),
            grad: None,
        }
    }

    /// This tensor with autograd link `grad`.
    pub(crate) fn with_grad(&self, grad: Option<crate::autograd::GradLink>) -> Tensor {
        Tensor {
            node: self.node.clone(),
            view: self.view.clone(),
            grad,
        }
    }

    pub(crate) fn grad_link(&self) -> Option<&crate::autograd::GradLink> {
        self.grad.as_ref()
    }

    /// Records a reduction of this tensor with its pending element-wise group as the
    /// prologue (see `lazy::with_prologue`, which passes `reduce` the lowering and the
    /// buffers to store the group's held members into). `None`, recording nothing: the
    /// tensor is realised, a view of part of its array or not dense, or needs a gradient.
    pub(crate) fn with_prologue<R>(
        &self,
        reduce: impl FnOnce(&mut crate::lazy::Lowered, &[helios_vk::Buffer]) -> Result<R>,
    ) -> Result<Option<R>> {
        let l = self.layout();
        let whole = l.is_dense() && l.offset() == 0 && l.len() == self.node.len;
        if !whole || self.node.is_realized() || crate::autograd::any_needs(&[self]) {
            return Ok(None);
        }
        crate::lazy::with_prologue(&self.node, reduce)
    }

    /// Whether the values are computed (or being computed) on the device, rather than
    /// waiting in the lazy graph.
    pub fn is_realized(&self) -> bool {
        self.node.is_realized()
    }

    /// Runs whatever this tensor's values depend on (without waiting for the GPU).
    pub fn realize(&self) -> Result<()> {
        self.buffer().map(|_| ())
    }

    /// Copies the tensor back to the host as f32 values in row-major order. Waits only for
    /// the work that writes this tensor.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; self.len() * self.dtype().size()];
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = self.device().context();
        let layout = self.layout();
        let whole = layout.is_dense() && layout.len() == self.node.len;
        if whole && !self.node.is_realized() && self.device().kernel_readback(bytes.len()) {
            // A small pending result: its kernel writes host memory, read in place.
            let buffer = self.node.buffer_in(MemoryLocation::HostVisible)?;
            ctx.download(buffer, 0, &mut bytes)?;
            return Ok(self.dtype().decode(&bytes));
        }
        if layout.is_contiguous() && !self.device().kernel_readback(bytes.len()) {
            let offset = (layout.offset() * self.dtype().size()) as u64;
            ctx.download(self.buffer()?, offset, &mut bytes)?;
        } else {
            // A copy kernel writes straight into host memory: on a discrete GPU this avoids
            // the copy engine and its transfer barrier, which dominate a small read-back; for
            // a strided view it is also the gather.
            let host = ctx.create_buffer(bytes.len() as u64, MemoryLocation::HostVisible)?;
            let copy = ElementwiseOp::Unary(UnaryOp::Copy);
            record_elementwise(copy, &[self], None, self.shape(), self.dtype(), &host)?;
            ctx.download(&host, 0, &mut bytes)?;
        }
        Ok(self.dtype().decode(&bytes))
    }

    pub fn dtype(&self) -> DType {
        self.node.dtype
    }

    pub fn shape(&self) -> &[usize] {
        self.layout().shape()
    }

    /// Shape, strides and offset of this view.
    pub fn layout(&self) -> &Layout {
        self.view.as_ref().unwrap_or(&self.node.layout)
    }

    /// Whether the elements are row-major from the start of the buffer (what kernels other
    /// than element-wise expect; `contiguous()` makes any tensor so).
    pub fn is_contiguous(&self) -> bool {
        self.layout().is_dense()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.layout().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn device(&self) -> &Device {
        self.node.device()
    }

    /// GPU address of the view's first element (for push constants), realising the tensor
    /// first. Kernels that assume row-major data take `contiguous()` tensors, whose first
    /// element starts the buffer.
    pub(crate) fn address(&self) -> Result<u64> {
        let offset = self.layout().offset() * self.dtype().size();
        Ok(self.buffer()?.device_address() + offset as u64)
    }

    /// The buffer holding the elements (for declaring accesses), realising the tensor first.
    pub(crate) fn buffer(&self) -> Result<&Buffer> {
        self.node.buffer()
    }

    // ------------------------------------------------------------ element-wise

    /// `op(self)` element by element.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let y = self.elementwise(ElementwiseOp::Unary(op), &[self], None, self.dtype())?;
        if !crate::autograd::any_needs(&[self]) {
            return Ok(y);
        }
        let (keep_x, keep_y) = grad_rules::unary_saves(op);
        let (x, yd) = (Saved::new(self, keep_x), Saved::new(&y, keep_y));
        Ok(crate::autograd::record(
            op.name(),
            &[self],
            y,
            move |g, _| {
                Ok(smallvec::smallvec![Some(grad_rules::unary(
                    op, &x, &yd, g
                )?)])
            },
        ))
    }

    /// `op(self, other)` element by element, the operands broadcast numpy-style (shapes
    /// aligned from the right; sizes equal or 1).
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        if !self.device().same(other.device()) {
            return Err(Error::DeviceMismatch { op: op.name() });
        }
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                lhs: self.dtype(),
                rhs: other.dtype(),
            });
        }
        let y = self.elementwise(
            ElementwiseOp::Binary(op),
            &[self, other],
            None,
            self.dtype(),
        )?;
        let differentiable = !BinaryOp::ACTIVATION_BACKWARD.contains(&op);
        if !differentiable || !crate::autograd::any_needs(&[self, other]) {
            return Ok(y);
        }
        let (keep_a, keep_b, keep_y) = grad_rules::binary_saves(op);
        let (a, b) = (Saved::new(self, keep_a), Saved::new(other, keep_b));
        let yd = Saved::new(&y, keep_y);
        Ok(crate::autograd::record(
            op.name(),
            &[self, other],
            y,
            move |g, _| {
                let (da, db) = grad_rules::binary(op, &a, &b, &yd, g)?;
                Ok(smallvec::smallvec![Some(da), Some(db)])
            },
        ))
    }

    /// `op(self, s)` element by element.
    pub fn scalar_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        self.scalar_form(op, s, false)
    }

    /// `op(s, self)` element by element (e.g. `1 / x`, `2 ^ x`).
    pub fn scalar_first_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        self.scalar_form(op, s, true)
    }

    fn scalar_form(&self, op: BinaryOp, s: f32, scalar_first: bool) -> Result<Tensor> {
        let form = ElementwiseOp::Scalar { op, scalar_first };
        let y = self.elementwise(form, &[self], Some(s), self.dtype())?;
        if !op.has_scalar_form() || !crate::autograd::any_needs(&[self]) {
            return Ok(y);
        }
        let (keep_x, keep_y) = grad_rules::scalar_saves(op, scalar_first);
        let (x, yd) = (Saved::new(self, keep_x), Saved::new(&y, keep_y));
        Ok(crate::autograd::record(
            op.name(),
            &[self],
            y,
            move |g, _| {
                let dx = grad_rules::scalar(op, s, scalar_first, &x, &yd, g)?;
                Ok(smallvec::smallvec![Some(dx)])
            },
        ))
    }

    /// `cond != 0 ? self : other`, all three broadcast together; the gradient flows to
    /// `self` where `cond` holds and to `other` elsewhere (`cond` gets none).
    pub fn where_(&self, cond: &Tensor, other: &Tensor) -> Result<Tensor> {
        self.same_dtype("where", other)?;
        let cond = cond.to_dtype(self.dtype())?;
        let y = cond.lazy(ElemOp::Where, &[&cond, self, other], self.dtype())?;
        if !crate::autograd::any_needs(&[self, other]) {
            return Ok(y);
        }
        let (c, a_shape, b_shape) = (cond.detach(), self.shape().to_vec(), other.shape().to_vec());
        Ok(crate::autograd::record(
            "where",
            &[self, other],
            y,
            move |g, _| {
                let zero = g.mul_scalar(0.0)?;
                let da = g.where_(&c, &zero)?;
                let db = zero.where_(&c, g)?;
                Ok(smallvec::smallvec![
                    Some(crate::autograd::reduce_to(&da, &a_shape)?),
                    Some(crate::autograd::reduce_to(&db, &b_shape)?),
                ])
            },
        ))
    }

    /// `value` where `mask != 0`, else this tensor (broadcast); the gradient flows where the
    /// mask is 0.
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        let fill = self.mul_scalar(0.0)?.detach().add_scalar(value)?;
        fill.where_(mask, self)
    }

    /// A tensor of `shape` holding `value` everywhere: filled on the GPU in order with the
    /// recorded work (no staging copy; autograd seeds every backward with one).
    pub fn full(device: &Device, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor> {
        let t = Tensor::empty(device, shape, dtype)?;
        // The element's bits over a 32-bit word: one f32, or two 16-bit elements.
        let b = dtype.encode(&[value, value]);
        let word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        device.context().fill(t.buffer()?, word)?;
        Ok(t)
    }

    /// Zeros of `shape`.
    pub fn zeros(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(device, shape, 0.0, dtype)
    }

    /// A lazy node computing `op` over `inputs` (broadcast to one shape) into a new dense
    /// tensor of `out`.
    pub(crate) fn elementwise(
        &self,
        op: ElementwiseOp,
        inputs: &[&Tensor],
        s: Option<f32>,
        out: DType,
    ) -> Result<Tensor> {
        let op = match op {
            ElementwiseOp::Unary(UnaryOp::Copy) if out != self.dtype() => ElemOp::Cast,
            ElementwiseOp::Unary(u) => ElemOp::Unary(u),
            ElementwiseOp::Binary(b) => ElemOp::Binary(b),
            ElementwiseOp::Scalar { op, scalar_first } => ElemOp::Scalar {
                op,
                s: s.expect("the scalar form carries its scalar"),
                scalar_first,
            },
        };
        self.lazy(op, inputs, out)
    }

    /// A lazy node computing `op` over `inputs` (one device, broadcast to one shape).
    pub(crate) fn lazy(&self, op: ElemOp, inputs: &[&Tensor], out: DType) -> Result<Tensor> {
        let mut layout = match op {
            ElemOp::Pad { dim, full, .. } => {
                let mut shape = self.shape().to_vec();
                shape[dim] = full;
                Cow::Owned(Layout::contiguous(&shape))
            }
            _ => self.layout().row_major(),
        };
        for t in &inputs[1..] {
            if !self.device().same(t.device()) {
                return Err(Error::DeviceMismatch { op: op.name() });
            }
            // Usually a broadcast operand read beside a full one: the shape stays.
            if t.shape() != layout.shape() && t.layout().broadcast_strides(layout.shape()).is_none()
            {
                let shape = broadcast_shapes(layout.shape(), t.shape()).ok_or_else(|| {
                    Error::ShapeMismatch {
                        op: op.name(),
                        lhs: self.shape().to_vec(),
                        rhs: t.shape().to_vec(),
                    }
                })?;
                layout = Cow::Owned(Layout::contiguous(&shape));
            }
        }
        let len = layout.len();
        if len == 0 {
            return Tensor::empty(self.device(), layout.shape(), out);
        }
        // Inputs read whole and element for element keep no view (see `Input::view`).
        let plain = !matches!(op, ElemOp::Pad { .. })
            && inputs
                .iter()
                .all(|t| Input::plain(&t.node, t.layout(), &layout));
        // Pushed one by one: `collect` goes through `SmallVec::extend`, which costs several
        // times as much for one or two items.
        let mut views = smallvec::SmallVec::new();
        for t in inputs {
            views.push(Input {
                node: t.node.clone(),
                view: (!plain).then(|| t.layout().clone()),
            });
        }
        let node = Node::pending(self.device().clone(), out, &layout, op, views)?;
        Ok(Tensor::from_node(node))
    }

    /// 1.0 where `self op other` (broadcast), else 0.0; no gradient.
    pub fn compare(&self, op: Compare, other: &Tensor) -> Result<Tensor> {
        self.same_dtype(op.name(), other)?;
        self.lazy(ElemOp::Compare(op), &[self, other], self.dtype())
    }

    /// 1.0 where `self op s`, else 0.0; no gradient.
    pub fn compare_scalar(&self, op: Compare, s: f32) -> Result<Tensor> {
        self.lazy(ElemOp::CompareScalar(op, s), &[self], self.dtype())
    }

    pub(crate) fn same_dtype(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: other.dtype(),
            });
        }
        Ok(())
    }
}

fn op_name(op: ElementwiseOp) -> &'static str {
    match op {
        ElementwiseOp::Unary(u) => u.name(),
        ElementwiseOp::Binary(b) | ElementwiseOp::Scalar { op: b, .. } => b.name(),
    }
}

/// Records `op` over `inputs` (one dtype, each broadcastable to `shape`) into the dense
/// `out` buffer of `shape` and dtype `out_dtype`.
pub(crate) fn record_elementwise(
    op: ElementwiseOp,
    inputs: &[&Tensor],
    s: Option<f32>,
    shape: &[usize],
    out_dtype: DType,
    out: &Buffer,
) -> Result<()> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let device = inputs[0].device();
    // The vec4 kernels need row-major operands of the output's shape whose first element is
    // 16-byte aligned: the buffer's start, or (with device addresses) any aligned offset,
    // such as a block of rows.
    let by_address = device.binding() == Binding::DeviceAddress;
    let dense = inputs.iter().all(|t| {
        let offset = t.layout().offset() * t.dtype().size();
        t.layout().is_contiguous()
            && t.shape() == shape
            && (offset == 0 || (by_address && offset % 16 == 0))
    });
    let (operands, strides) = if dense {
        (OperandLayout::Contiguous { len: n }, None)
    } else {
        let strides = strided_args(op, inputs, shape)?;
        let dims = strides.shape.len();
        (OperandLayout::Strided { dims }, Some(strides))
    };
    let kernel = device.elementwise_kernel(op, inputs[0].dtype(), out_dtype, operands);
    let compiled = device.kernel(KernelKey::Elementwise(kernel), || kernel.build())?;
    // Strided kernels take element offsets in push constants, so their inputs are passed by
    // their buffers' base addresses.
    let addrs: Vec<u64> = inputs
        .iter()
        .map(|t| match dense {
            true => t.address(),
            false => t.buffer().map(|b| b.device_address()),
        })
        .collect::<Result<_>>()?;
    let launch = kernel.launch(
        &compiled.module,
        Geometry {
            workgroup: compiled.workgroup[0],
            max_groups_x: device.max_groups_x(),
        },
        n as u64,
        ElementwiseAddresses {
            inputs: &addrs,
            output: out.device_address(),
        },
        s,
        strides.as_ref(),
    )?;
    let mut accesses: Vec<Access> = inputs
        .iter()
        .map(|t| t.buffer().map(Access::read))
        .collect::<Result<_>>()?;
    accesses.push(Access::write(out));
    device
        .context()
        .dispatch(&compiled.pipeline, launch.groups, &launch.push, &accesses)?;
    Ok(())
}

/// The strided kernel's sizes and strides for `inputs` broadcast to `shape`, after merging
/// dimensions that are contiguous in every operand.
fn strided_args(op: ElementwiseOp, inputs: &[&Tensor], shape: &[usize]) -> Result<Strides> {
    let mut strides: Vec<Vec<usize>> = inputs
        .iter()
        .map(|t| {
            t.layout()
                .broadcast_strides(shape)
                .expect("operands broadcast to the output shape")
                .into_vec()
        })
        .collect();
    let merged = merge_dims(shape, &mut strides);
    if merged.len() > MAX_DIMS {
        return Err(Error::TooManyDims {
            op: op_name(op),
            dims: merged.len(),
            max: MAX_DIMS,
        });
    }
    let to_u32 = |v: usize| {
        u32::try_from(v).map_err(|_| {
            Error::Kernel(helios_kernels::KernelError::TooLarge {
                what: "stride or offset",
                size: v as u64,
            })
        })
    };
    let mut out_inputs = Vec::with_capacity(inputs.len());
    for (t, st) in inputs.iter().zip(strides) {
        let st = st.into_iter().map(to_u32).collect::<Result<Vec<u32>>>()?;
        out_inputs.push((st, to_u32(t.layout().offset())?));
    }
    Ok(Strides {
        shape: merged
            .into_iter()
            .map(to_u32)
            .collect::<Result<Vec<u32>>>()?,
        inputs: out_inputs,
    })
}

macro_rules! unary_methods {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("`", stringify!($name), "` of every element.")]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods!(
    copy => Copy, neg => Neg, abs => Abs, exp => Exp, log => Log, sqrt => Sqrt, rsqrt => Rsqrt,
    tanh => Tanh, sigmoid => Sigmoid, relu => Relu, gelu_tanh => GeluTanh, silu => Silu,
);

macro_rules! binary_methods {
    ($($name:ident, $scalar:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $(
                #[doc = concat!("Element-wise `", stringify!($name), "` of two tensors (broadcast).")]
                pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
                    self.binary(BinaryOp::$op, other)
                }

                #[doc = concat!("Element-wise `", stringify!($name), "` with a scalar on the right.")]
                pub fn $scalar(&self, s: f32) -> Result<Tensor> {
                    self.scalar_op(BinaryOp::$op, s)
                }
            )*
        }
    };
}

binary_methods!(
    add, add_scalar => Add,
    sub, sub_scalar => Sub,
    mul, mul_scalar => Mul,
    div, div_scalar => Div,
    maximum, maximum_scalar => Max,
    minimum, minimum_scalar => Min,
    pow, pow_scalar => Pow,
);

impl Tensor {
    /// The gradient of `gelu_tanh` at `self` (= x) times `dy`: dx = dy · gelu_tanh'(x).
    pub fn gelu_tanh_backward(&self, dy: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::GeluTanhBackward, dy)
    }

    /// The gradient of `silu` at `self` (= x) times `dy`: dx = dy · silu'(x).
    pub fn silu_backward(&self, dy: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::SiluBackward, dy)
    }

    /// The gradient of `relu` at `self` (= x) times `dy`: dy where x > 0, else 0.
    pub fn relu_backward(&self, dy: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::ReluBackward, dy)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.layout();
        f.debug_struct("Tensor")
            .field("shape", &l.shape())
            .field("strides", &l.strides())
            .field("offset", &l.offset())
            .field("dtype", &self.dtype())
            .field("device", self.device())
            .finish()
    }
}
