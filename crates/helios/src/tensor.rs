//! `Tensor`: an immutable array on a device (a view of a shared buffer), and its element-wise
//! operations.
//!
//! Operations are recorded, not waited for: each appends one dispatch to the device's open
//! batch (with a barrier only where it depends on an earlier dispatch), and batches are
//! submitted as they fill. Only `to_vec` waits, and only for the batch that wrote the tensor.
//!
//! A tensor is a `Layout` (shape, strides, offset) over a buffer shared by all its views, so
//! views cost no GPU work (`view.rs`). Element-wise ops read any layout and broadcast their
//! operands numpy-style; their output is always a fresh row-major tensor. When every operand
//! is dense and of the output's shape they run the vec4 kernels, otherwise the strided one.

use std::sync::Arc;

use helios_kernels::{BinaryOp, ElementwiseOp, Geometry, Strides, UnaryOp, MAX_DIMS};
use helios_spirv::Binding;
use helios_vk::{Access, Buffer, MemoryLocation};

use crate::device::{KernelKey, OperandLayout};
use crate::layout::{broadcast_shapes, merge_dims, Layout};
use crate::{DType, Device, Error, Result};

/// An n-dimensional array in device memory, stored as `dtype` (arithmetic is f32). Cloning
/// is cheap; views share the buffer.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    data: Arc<Data>,
    layout: Layout,
    dtype: DType,
}

/// The buffer behind a tensor and all its views.
struct Data {
    device: Device,
    buffer: Buffer,
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
        let t = Tensor::empty(device, shape.to_vec(), dtype)?;
        if !data.is_empty() {
            device
                .context()
                .upload(t.buffer(), 0, &dtype.encode(data))?;
        }
        Ok(t)
    }

    /// A 1-D f32 tensor holding `data`.
    pub fn from_vec1(device: &Device, data: &[f32]) -> Result<Tensor> {
        Tensor::from_slice(device, data, &[data.len()])
    }

    /// A dense tensor of `shape` whose contents are undefined until a kernel writes them.
    pub(crate) fn empty(device: &Device, shape: Vec<usize>, dtype: DType) -> Result<Tensor> {
        let bytes = (shape.iter().product::<usize>() * dtype.size()) as u64;
        let buffer = device
            .context()
            .create_buffer(bytes, MemoryLocation::DeviceLocal)?;
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                data: Arc::new(Data {
                    device: device.clone(),
                    buffer,
                }),
                layout: Layout::contiguous(&shape),
                dtype,
            }),
        })
    }

    /// Another view of this tensor's buffer.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            inner: Arc::new(TensorInner {
                data: self.inner.data.clone(),
                layout,
                dtype: self.inner.dtype,
            }),
        }
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
        if layout.is_contiguous() && !self.device().kernel_readback(bytes.len()) {
            let offset = (layout.offset() * self.dtype().size()) as u64;
            ctx.download(self.buffer(), offset, &mut bytes)?;
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
        self.inner.dtype
    }

    pub fn shape(&self) -> &[usize] {
        self.inner.layout.shape()
    }

    /// Shape, strides and offset of this view.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// Whether the elements are row-major from the start of the buffer (what kernels other
    /// than element-wise expect; `contiguous()` makes any tensor so).
    pub fn is_contiguous(&self) -> bool {
        self.inner.layout.is_dense()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.inner.layout.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn device(&self) -> &Device {
        &self.inner.data.device
    }

    /// GPU address of the view's first element (for push constants). Kernels that assume
    /// row-major data take `contiguous()` tensors, whose first element starts the buffer.
    pub(crate) fn address(&self) -> u64 {
        let offset = self.inner.layout.offset() * self.dtype().size();
        self.inner.data.buffer.device_address() + offset as u64
    }

    /// The buffer holding the elements (for declaring accesses).
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.inner.data.buffer
    }

    // ------------------------------------------------------------ element-wise

    /// `op(self)` element by element.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.elementwise(ElementwiseOp::Unary(op), &[self], None, self.dtype())
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
        self.elementwise(
            ElementwiseOp::Binary(op),
            &[self, other],
            None,
            self.dtype(),
        )
    }

    /// `op(self, s)` element by element.
    pub fn scalar_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        let op = ElementwiseOp::Scalar {
            op,
            scalar_first: false,
        };
        self.elementwise(op, &[self], Some(s), self.dtype())
    }

    /// `op(s, self)` element by element (e.g. `1 / x`, `2 ^ x`).
    pub fn scalar_first_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        let op = ElementwiseOp::Scalar {
            op,
            scalar_first: true,
        };
        self.elementwise(op, &[self], Some(s), self.dtype())
    }

    /// Runs `op` over `inputs` (broadcast to one shape) into a new dense tensor of `out`.
    pub(crate) fn elementwise(
        &self,
        op: ElementwiseOp,
        inputs: &[&Tensor],
        s: Option<f32>,
        out: DType,
    ) -> Result<Tensor> {
        let mut shape = self.shape().to_vec();
        for t in &inputs[1..] {
            shape = broadcast_shapes(&shape, t.shape()).ok_or_else(|| Error::ShapeMismatch {
                op: op_name(op),
                lhs: self.shape().to_vec(),
                rhs: t.shape().to_vec(),
            })?;
        }
        let y = Tensor::empty(self.device(), shape, out)?;
        record_elementwise(op, inputs, s, y.shape(), out, y.buffer())?;
        Ok(y)
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
fn record_elementwise(
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
            false => t.buffer().device_address(),
        })
        .collect();
    let launch = kernel.launch(
        &compiled.module,
        Geometry {
            workgroup: compiled.workgroup[0],
            max_groups_x: device.max_groups_x(),
        },
        n as u64,
        &addrs,
        out.device_address(),
        s,
        strides.as_ref(),
    )?;
    let mut accesses: Vec<Access> = inputs.iter().map(|t| Access::read(t.buffer())).collect();
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
