//! `Tensor`: an immutable f32 array on a device, and its element-wise operations.
//!
//! Operations are recorded, not waited for: each appends one dispatch to the device's open
//! batch (with a barrier only where it depends on an earlier dispatch), and batches are
//! submitted as they fill. Only `to_vec` waits, and only for the batch that wrote the tensor.

use std::sync::Arc;

use helios_kernels::{BinaryOp, ElementwiseOp, Geometry, UnaryOp};
use helios_vk::{Access, Buffer, MemoryLocation};

use crate::device::KernelKey;
use crate::{DType, Device, Error, Result};

/// An n-dimensional f32 array in device memory. Cloning is cheap (shared storage).
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    device: Device,
    buffer: Buffer,
    /// Row-major, contiguous.
    shape: Vec<usize>,
    dtype: DType,
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
                .upload(&t.inner.buffer, 0, &dtype.encode(data))?;
        }
        Ok(t)
    }

    /// A 1-D f32 tensor holding `data`.
    pub fn from_vec1(device: &Device, data: &[f32]) -> Result<Tensor> {
        Tensor::from_slice(device, data, &[data.len()])
    }

    /// A tensor of `shape` whose contents are undefined until a kernel writes them.
    pub(crate) fn empty(device: &Device, shape: Vec<usize>, dtype: DType) -> Result<Tensor> {
        let bytes = (shape.iter().product::<usize>() * dtype.size()) as u64;
        let buffer = device
            .context()
            .create_buffer(bytes, MemoryLocation::DeviceLocal)?;
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                device: device.clone(),
                buffer,
                shape,
                dtype,
            }),
        })
    }

    /// Copies the tensor back to the host as f32 values. Waits only for the work that
    /// writes this tensor.
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; self.len() * self.dtype().size()];
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = self.inner.device.context();
        if self.device().kernel_readback(bytes.len()) {
            // A copy kernel writes straight into host memory: on a discrete GPU this avoids
            // the copy engine and its transfer barrier, which dominate a small read-back.
            let host = ctx.create_buffer(bytes.len() as u64, MemoryLocation::HostVisible)?;
            self.record_elementwise(ElementwiseOp::Unary(UnaryOp::Copy), &[self], None, &host)?;
            ctx.download(&host, 0, &mut bytes)?;
        } else {
            ctx.download(self.buffer(), 0, &mut bytes)?;
        }
        Ok(self.dtype().decode(&bytes))
    }

    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.inner.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// GPU address of element 0 (for push constants).
    pub(crate) fn address(&self) -> u64 {
        self.inner.buffer.device_address()
    }

    /// The buffer holding the elements (for declaring accesses).
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.inner.buffer
    }

    // ------------------------------------------------------------ element-wise

    /// `op(self)` element by element.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.elementwise(ElementwiseOp::Unary(op), &[self], None)
    }

    /// `op(self, other)` element by element; the shapes must be equal.
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        if self.shape() != other.shape() {
            return Err(Error::ShapeMismatch {
                op: op.name(),
                lhs: self.shape().to_vec(),
                rhs: other.shape().to_vec(),
            });
        }
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
        self.elementwise(ElementwiseOp::Binary(op), &[self, other], None)
    }

    /// `op(self, s)` element by element.
    pub fn scalar_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        self.elementwise(
            ElementwiseOp::Scalar {
                op,
                scalar_first: false,
            },
            &[self],
            Some(s),
        )
    }

    /// `op(s, self)` element by element (e.g. `1 / x`, `2 ^ x`).
    pub fn scalar_first_op(&self, op: BinaryOp, s: f32) -> Result<Tensor> {
        self.elementwise(
            ElementwiseOp::Scalar {
                op,
                scalar_first: true,
            },
            &[self],
            Some(s),
        )
    }

    fn elementwise(&self, op: ElementwiseOp, inputs: &[&Tensor], s: Option<f32>) -> Result<Tensor> {
        let out = Tensor::empty(self.device(), self.shape().to_vec(), self.dtype())?;
        self.record_elementwise(op, inputs, s, &out.inner.buffer)?;
        Ok(out)
    }

    /// Records `op` over `inputs` (of this tensor's shape and dtype) into `out`.
    fn record_elementwise(
        &self,
        op: ElementwiseOp,
        inputs: &[&Tensor],
        s: Option<f32>,
        out: &Buffer,
    ) -> Result<()> {
        let device = self.device();
        let n = self.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let kernel = device.elementwise_kernel(op, self.dtype());
        let compiled = device.kernel(KernelKey::Elementwise(kernel), || kernel.build())?;
        let addrs: Vec<u64> = inputs.iter().map(|t| t.address()).collect();
        let wg = compiled.workgroup[0];
        let launch = kernel.launch(
            &compiled.module,
            Geometry {
                workgroup: wg,
                max_groups_x: device.max_groups_x(),
            },
            n,
            &addrs,
            out.device_address(),
            s,
            None,
        )?;
        let mut accesses: Vec<Access> = inputs.iter().map(|t| Access::read(t.buffer())).collect();
        accesses.push(Access::write(out));
        device
            .context()
            .dispatch(&compiled.pipeline, launch.groups, &launch.push, &accesses)?;
        Ok(())
    }
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
                #[doc = concat!("Element-wise `", stringify!($name), "` of two tensors of one shape.")]
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

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape())
            .field("device", self.device())
            .finish()
    }
}
